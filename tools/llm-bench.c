/* llm-bench - time prefill and decode of one model on the CPU backend, and
 * measure memory bandwidth with a large copy, for `make bench`.
 *   llm-bench -m MODEL.gguf [-p 128] [-n 64] [-t THREADS] [-r REPS]
 *   llm-bench --bandwidth [-t THREADS]
 * Prints one line of key=value pairs (parsed by tests/bench/bench.py):
 * mean and standard deviation over REPS runs after one warm-up run, the
 * same statistics llama-bench reports. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cli.h"
#include "llm/kv_cache.h"
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

static int run(const char *path, int n_prompt, int n_gen, int threads, int reps)
{
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_session *s = NULL;
    llm_cpu_config cc = {threads, 0, getenv("LLM_KERNELS")};
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int rc = 1;
    if (!toks || llm_model_load(path, &m, &err) || llm_backend_cpu_new(&cc, &b, &err) ||
        llm_session_new(m, b, &(llm_session_config){.n_ctx = n_prompt + n_gen + 1, .max_batch = 512, .kv_type = (int)g_kv}, &s, &err))
        goto out;
    for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)((i * 7919 + 13) % m->hp.n_vocab);
    double pp[101], tg[101];
    const float *logits;
    for (int r = 0; r <= reps; r++) { /* run 0 warms caches and pages up, as llama-bench does */
        llm_session_reset(s);
        double t0 = cli_now();
        if (llm_session_eval(s, toks, n_prompt, &logits, &err))
            goto out;
        double t1 = cli_now();
        /* decode from an empty context, as llama-bench's tg test does */
        llm_session_reset(s);
        double t2 = cli_now();
        for (int i = 0; i < n_gen; i++) {
            int32_t t = toks[i % n_prompt];
            if (llm_session_eval(s, &t, 1, &logits, &err))
                goto out;
        }
        pp[r] = n_prompt / (t1 - t0);
        tg[r] = n_gen / (cli_now() - t2);
    }
    double pp_sd, tg_sd, pp_mean = mean_sd(pp + 1, reps, &pp_sd), tg_mean = mean_sd(tg + 1, reps, &tg_sd);
    /* a decode step reads one row of the embedding, unless it is also the output */
    size_t emb = (size_t)m->tok_embd.rows * m->tok_embd.row_bytes;
    size_t step = llm_model_weight_bytes(m) - (m->output.data == m->tok_embd.data ? 0 : emb);
    printf("model=%s threads=%d kernels=%s weight_bytes=%zu decode_bytes=%zu prefill_tps=%.2f prefill_sd=%.2f "
           "decode_tps=%.2f decode_sd=%.2f\n", m->name, threads, llm_backend_cpu_kernels(b), llm_model_weight_bytes(m),
           step, pp_mean, pp_sd, tg_mean, tg_sd);
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

int main(int argc, char **argv)
{
    const char *model = NULL;
    long p = 128, n = 64, t = 1, r = 3;
    int bw = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--bandwidth")) { bw = 1; continue; }
        if (!strcmp(a, "-m") && v) model = v;
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
            fprintf(stderr, "usage: llm-bench -m MODEL.gguf [-p 128] [-n 64] [-t 1] [-r 3] [--kv-type f16|f32|q8_0] | --bandwidth [-t N]\n");
            return 2;
        }
        i++;
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
