/* llm-perplexity - perplexity of a model over a text file, computed as
 * llama.cpp's llama-perplexity does so the two can be compared: the text's
 * tokens in chunks of --ctx, each chunk evaluated from position 0 with its
 * first token replaced by BOS (when the vocabulary adds one), and the second
 * half of each chunk scored: token j + 1 under the logits at j, for j in
 * [ctx / 2, ctx - 1).
 *   llm-perplexity -m MODEL.gguf -f TEXT [--ctx 512] [--chunks N] [-t T]
 *                  [--kv-type f16|f32|q8_0] [--save-logits F | --kl-divergence F]
 * --save-logits writes every scored position's log-probabilities (F16, as
 * llama.cpp keeps them) for a --kl-divergence run of another model of the
 * same vocabulary over the same text: mean KL(base || this), its 99th
 * percentile, and how often the two models' most likely tokens agree (the
 * usual way to judge a quantization).
 * File: "LLMKL\1\0\0", u32 n_vocab, n_ctx, n_chunks, then the chunks'
 * tokens (int32), then per scored position n_vocab F16 log-probs. */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "llm/kv_cache.h"
#include "llm/model.h"
#include "llm/tokenizer.h"

#define KL_MAGIC "LLMKL\1\0"

typedef struct opts {
    const char *model, *file, *save, *base;
    long ctx, chunks, threads, kv_type;
} opts;

typedef struct scorer {
    const opts *o;
    const llm_model *m;
    const int32_t *tok;    /* this chunk's tokens (ctx) */
    double nll, nll2;      /* sums over scored positions */
    long count, top1;
    FILE *save, *base;
    quant_f16 *row16;      /* (n_vocab) */
    double *lp;            /* (n_vocab) this model's log-probs */
    float *kl;             /* (scored positions) */
    int failed;            /* 1: the logits file could not be read or written; 2: the base holds a NaN */
} scorer;

static int usage(void)
{
    fprintf(stderr, "usage: llm-perplexity -m MODEL.gguf -f TEXT [--ctx 512] [--chunks N] [-t THREADS]\n"
                    "                      [--kv-type f16|f32|q8_0] [--save-logits FILE | --kl-divergence FILE]\n");
    return 2;
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.ctx = 512, .threads = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, used = 1;
        if (!strcmp(a, "-m") && v) o->model = v;
        else if (!strcmp(a, "-f") && v) o->file = v;
        else if (!strcmp(a, "--save-logits") && v) o->save = v;
        else if (!strcmp(a, "--kl-divergence") && v) o->base = v;
        else if (!strcmp(a, "--ctx")) rc = cli_int(a, v, 8, 1 << 20, &o->ctx);
        else if (!strcmp(a, "--chunks")) rc = cli_int(a, v, 1, 1 << 30, &o->chunks);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) rc = cli_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--kv-type") && v) {
            llm_kv_type t;
            llm_error err = {0};
            rc = llm_kv_type_parse(v, &t, &err) ? -1 : 0;
            if (rc)
                fprintf(stderr, "error: --kv-type: %s\n", err.msg);
            else
                o->kv_type = (long)t;
        } else
            used = 0;
        if (rc)
            return -1;
        if (!used)
            return usage(), -1;
        i++;
    }
    if (!o->model || !o->file || (o->save && o->base))
        return usage(), -1;
    return 0;
}

/* The whole file (at most LLM_TOKENIZE_MAX_BYTES), NUL-terminated. */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && n <= LLM_TOKENIZE_MAX_BYTES && !fseek(f, 0, SEEK_SET) &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len = (size_t)n;
    } else {
        fprintf(stderr, "error: %s: %s\n", path, !f || n < 0 ? strerror(errno) : "too large or unreadable");
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    return buf;
}

/* Log-softmax of a logits row in double into lp; returns the argmax. */
static int log_softmax(const float *lg, int n, double *lp)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[best])
            best = i;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)lg[i] - lg[best]);
    double lse = (double)lg[best] + log(sum);
    for (int i = 0; i < n; i++) lp[i] = (double)lg[i] - lse;
    return best;
}

/* KL(base || this) at one position, from the base's F16 log-probs; *agree
 * gets whether the two most likely tokens are the same. */
static double kl_position(scorer *s, int n, int best, int *agree)
{
    double kl = 0;
    int bbest = 0;
    for (int i = 0; i < n; i++) {
        double b = quant_f16_to_f32(s->row16[i]);
        if (b > quant_f16_to_f32(s->row16[bbest]))
            bbest = i;
        if (b != -INFINITY) /* a token the base gives no weight adds nothing (0 * -inf is not 0) */
            kl += exp(b) * (b - s->lp[i]);
    }
    *agree = bbest == best;
    if (!isfinite(kl))
        return NAN; /* a NaN in the base: the caller refuses the file */
    return kl > 0 ? kl : 0; /* F16 rounding of the base can make a tiny KL negative */
}

/* Called for every token of a chunk: scores positions [ctx/2, ctx - 1). */
static int score(void *ctx, int i, const float *logits)
{
    scorer *s = ctx;
    int n = s->m->hp.n_vocab;
    if (i < s->o->ctx / 2 || i >= s->o->ctx - 1)
        return 0;
    int best = log_softmax(logits, n, s->lp);
    double nll = -s->lp[s->tok[i + 1]];
    s->nll += nll;
    s->nll2 += nll * nll;
    if (s->save || s->base) {
        if (s->save) {
            for (int k = 0; k < n; k++) s->row16[k] = quant_f32_to_f16((float)s->lp[k]);
            s->failed |= fwrite(s->row16, sizeof *s->row16, (size_t)n, s->save) != (size_t)n;
        } else if (fread(s->row16, sizeof *s->row16, (size_t)n, s->base) != (size_t)n) {
            s->failed = 1;
        } else {
            int agree;
            double kl = kl_position(s, n, best, &agree);
            s->kl[s->count] = (float)kl;
            s->top1 += agree;
            s->failed |= isnan(kl) ? 2 : 0;
        }
    }
    s->count++;
    return s->failed;
}

/* Writes (save) or checks (base) the header and the chunks' tokens: a base
 * made from other text or another vocabulary is refused. */
static int kl_header(scorer *s, const int32_t *tok, long n_chunks)
{
    uint32_t h[3] = {(uint32_t)s->m->hp.n_vocab, (uint32_t)s->o->ctx, (uint32_t)n_chunks}, g[3];
    size_t nt = (size_t)n_chunks * (size_t)s->o->ctx;
    char magic[8];
    if (s->save)
        return fwrite(KL_MAGIC, 1, 8, s->save) != 8 || fwrite(h, sizeof h, 1, s->save) != 1 ||
                       fwrite(tok, sizeof *tok, nt, s->save) != nt
                   ? (fprintf(stderr, "error: %s: %s\n", s->o->save, strerror(errno)), -1)
                   : 0;
    int32_t *bt = malloc(sizeof *bt * nt);
    if (!bt) {
        fprintf(stderr, "error: no memory for %zu tokens\n", nt);
        return -1;
    }
    int ok = fread(magic, 1, 8, s->base) == 8 && !memcmp(magic, KL_MAGIC, 8) && fread(g, sizeof g, 1, s->base) == 1;
    if (ok && (g[0] != h[0] || g[1] != h[1] || g[2] < h[2]))
        fprintf(stderr, "error: %s: base has vocab %u, ctx %u, %u chunks; this run has %u, %u, %u\n", s->o->base, g[0],
                g[1], g[2], h[0], h[1], h[2]), ok = 0;
    else if (ok && (fread(bt, sizeof *bt, nt, s->base) != nt || memcmp(bt, tok, sizeof *bt * nt)))
        fprintf(stderr, "error: %s: the base was made from other tokens (another text or tokenizer)\n", s->o->base), ok = 0;
    else if (!ok)
        fprintf(stderr, "error: %s: not a --save-logits file\n", s->o->base);
    if (ok && g[2] > h[2]) /* fewer chunks here: skip the base's extra tokens */
        ok = !fseek(s->base, (long)(sizeof *bt) * (long)(g[2] - h[2]) * (long)h[1], SEEK_CUR);
    free(bt);
    return ok ? 0 : -1;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void report(scorer *s, double secs, long tokens)
{
    double mean = s->nll / (double)s->count, var = s->nll2 / (double)s->count - mean * mean;
    double ppl = exp(mean), err = s->count > 1 ? ppl * sqrt(var > 0 ? var / (double)(s->count - 1) : 0) : 0;
    printf("Final estimate: PPL = %.4f +/- %.5f (%ld scored tokens, ctx %ld, %.0f tokens/s)\n", ppl, err, s->count,
           s->o->ctx, (double)tokens / secs);
    if (!s->base)
        return;
    qsort(s->kl, (size_t)s->count, sizeof *s->kl, cmp_float);
    double sum = 0;
    for (long i = 0; i < s->count; i++) sum += s->kl[i];
    printf("KL divergence: mean %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%% (%ld samples)\n",
           sum / (double)s->count, s->kl[(long)(0.99 * (double)(s->count - 1))], s->kl[s->count - 1],
           100.0 * (double)s->top1 / (double)s->count, s->count);
}

/* Every chunk through the session, scored; 0 on success. */
static int run_chunks(scorer *s, llm_session *ses, const llm_vocab *v, int32_t *tok, long n_chunks)
{
    double t0 = cli_now();
    llm_error err = {0};
    for (long c = 0; c < n_chunks; c++) {
        int32_t *chunk = tok + c * s->o->ctx, first = chunk[0];
        if (llm_vocab_add_bos(v) && llm_vocab_bos(v) >= 0)
            chunk[0] = llm_vocab_bos(v); /* every chunk starts as a text does (as llama.cpp) */
        s->tok = chunk;
        llm_session_reset(ses);
        llm_status st = llm_session_eval_each(ses, chunk, (int)s->o->ctx, score, s, &err);
        chunk[0] = first;
        if (s->failed) { /* checked first: it is why the evaluation stopped */
            const char *file = s->save ? s->o->save : s->o->base;
            fprintf(stderr, "error: chunk %ld: %s: %s\n", c, file,
                    s->failed == 2 ? "holds a NaN log-probability (a corrupt base)"
                    : s->base && feof(s->base) ? "ends early (a truncated base)" : strerror(errno));
            return -1;
        }
        if (st) {
            fprintf(stderr, "error: chunk %ld: %s\n", c, err.msg);
            return -1;
        }
        fprintf(stderr, "[%ld] %.4f\n", c + 1, exp(s->nll / (double)s->count));
    }
    report(s, cli_now() - t0, n_chunks * s->o->ctx);
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_session *ses = NULL;
    int32_t *tok = NULL;
    int n = 0, rc = 1;
    size_t len = 0;
    char *text = read_text(o.file, &len);
    scorer s = {.o = &o};
    if (!text || llm_model_load(o.model, &m, &err) ||
        llm_backend_cpu_new(&(llm_cpu_config){.n_threads = (int)o.threads}, &b, &err) ||
        llm_session_new(m, b, &(llm_session_config){.n_ctx = (int)o.ctx, .kv_type = (int)o.kv_type, .logit_rows = 64},
                        &ses, &err) ||
        llm_tokenize(m->vocab, text, len, 1, 0, &tok, &n, &err)) {
        if (text)
            fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    long n_chunks = n / o.ctx;
    if (o.chunks && o.chunks < n_chunks)
        n_chunks = o.chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "error: %s has %d tokens, fewer than one chunk of %ld\n", o.file, n, o.ctx);
        goto out;
    }
    s.m = m;
    s.row16 = malloc(sizeof *s.row16 * (size_t)m->hp.n_vocab);
    s.lp = malloc(sizeof *s.lp * (size_t)m->hp.n_vocab);
    s.kl = malloc(sizeof *s.kl * (size_t)n_chunks * (size_t)o.ctx);
    s.save = o.save ? fopen(o.save, "wb") : NULL;
    s.base = o.base ? fopen(o.base, "rb") : NULL;
    if (!s.row16 || !s.lp || !s.kl || (o.save && !s.save) || (o.base && !s.base)) {
        fprintf(stderr, "error: %s\n", (o.save && !s.save) || (o.base && !s.base) ? strerror(errno) : "no memory");
        goto out;
    }
    fprintf(stderr, "%s: %d tokens, %ld chunks of %ld\n", o.file, n, n_chunks, o.ctx);
    if ((s.save || s.base) && kl_header(&s, tok, n_chunks))
        goto out;
    rc = run_chunks(&s, ses, m->vocab, tok, n_chunks) ? 1 : 0;
out:
    if (s.save && fclose(s.save) && !rc)
        rc = (fprintf(stderr, "error: %s: %s\n", o.save, strerror(errno)), 1);
    if (s.base)
        fclose(s.base);
    free(s.row16);
    free(s.lp);
    free(s.kl);
    free(tok);
    free(text);
    llm_session_free(ses);
    llm_backend_free(b);
    llm_model_free(m);
    return rc;
}
