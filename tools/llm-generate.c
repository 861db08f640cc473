/* llm-generate - generate text from a prompt with a GGUF model on the CPU.
 *   llm-generate -m MODEL.gguf -p PROMPT [-n 64] [--temp 0] [--seed S] [--threads T]
 *                [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--ctx N]
 *                [--kv-type f16|f32|q8_0] [--ids] [--scalar] [--lora ADAPTER.gguf [--lora-scale S]]
 * Prints the text as it is generated, then prompt and decode tokens/s on
 * stderr. --ids also prints the prompt and generated token ids and, for each
 * generated token, the gap between the two largest logits (how near a tie
 * the greedy choice was: used when comparing with other engines). --lora
 * runs with a LoRA adapter in llama.cpp's format (lora.h) at scale S
 * (default 1), as llama.cpp's --lora / --lora-scaled do. */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "llm/kv_cache.h"
#include "llm/lora.h"
#include "llm/model.h"
#include "llm/sampler.h"

typedef struct opts {
    const char *model, *prompt, *backend, *lora;
    double lora_scale;
    long n_predict, threads, ctx, tp;
    int ids, scalar;
    llm_kv_type kv_type;
    llm_sampling s;
} opts;

static int usage(void)
{
    fprintf(stderr, "usage: llm-generate -m MODEL.gguf -p PROMPT [-n 64] [--temp T] [--seed S] [--threads N]\n"
                    "       [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--ctx N]\n"
                    "       [--kv-type f16|f32|q8_0] [--ids] [--scalar] [--backend cpu|cuda] [--tp N]\n"
                    "       [--lora ADAPTER.gguf [--lora-scale S]]\n");
    return 2;
}

static int kv_type_arg(const char *v, llm_kv_type *t)
{
    llm_error err = {0};
    if (!llm_kv_type_parse(v, t, &err))
        return 0;
    fprintf(stderr, "error: --kv-type: %s\n", err.msg);
    return 1;
}

static int parse(int argc, char **argv, opts *o)
{
    double d;
    long l;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, bad = 0;
        if (!strcmp(a, "-m") && v) o->model = v;
        else if (!strcmp(a, "-p") && v) o->prompt = v;
        else if (!strcmp(a, "-n")) bad = cli_int(a, v, 0, 1 << 20, &o->n_predict);
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) bad = cli_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--ctx")) bad = cli_int(a, v, 0, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--backend") && v) o->backend = v;
        else if (!strcmp(a, "--lora") && v) o->lora = v;
        else if (!strcmp(a, "--lora-scale")) bad = cli_float(a, v, -1000, 1000, &o->lora_scale);
        else if (!strcmp(a, "--tp")) bad = cli_int(a, v, 1, LLM_MAX_RANKS, &o->tp);
        else if (!strcmp(a, "--kv-type") && v) bad = kv_type_arg(v, &o->kv_type);
        else if (!strcmp(a, "--seed")) { bad = cli_int(a, v, 0, 0x7fffffffffffL, &l); o->s.seed = (uint64_t)l; }
        else if (!strcmp(a, "--temp")) { bad = cli_float(a, v, 0, 100, &d); o->s.temperature = (float)d; }
        else if (!strcmp(a, "--top-k")) { bad = cli_int(a, v, 0, 1 << 30, &l); o->s.top_k = (int)l; }
        else if (!strcmp(a, "--top-p")) { bad = cli_float(a, v, 0, 1, &d); o->s.top_p = (float)d; }
        else if (!strcmp(a, "--min-p")) { bad = cli_float(a, v, 0, 1, &d); o->s.min_p = (float)d; }
        else if (!strcmp(a, "--repeat-penalty")) { bad = cli_float(a, v, 0, 10, &d); o->s.repetition_penalty = (float)d; }
        else { used = 0; if (!strcmp(a, "--ids")) o->ids = 1; else if (!strcmp(a, "--scalar")) o->scalar = 1; else return usage(); }
        if (bad || (used && !v))
            return bad ? 2 : usage();
        i += used;
    }
    return o->model && o->prompt ? 0 : usage();
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "%s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Gap between the two largest logits: how close a greedy choice was. */
static float top2_gap(const float *l, int n)
{
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (l[i] > a) { b = a; a = l[i]; }
        else if (l[i] > b) b = l[i];
    }
    return a - b;
}

static int generate(const opts *o, const llm_model *m, llm_session *ses, llm_error *err)
{
    int32_t *prompt, *out = malloc(sizeof(int32_t) * (size_t)(o->n_predict + 1));
    float *gaps = malloc(sizeof(float) * (size_t)(o->n_predict + 1));
    int n_prompt;
    llm_sampler *smp = NULL;
    if (!out || !gaps || llm_tokenize(m->vocab, o->prompt, strlen(o->prompt), 1, 1, &prompt, &n_prompt, err)) {
        int oom = !out || !gaps;
        free(out);
        free(gaps);
        return oom ? (fprintf(stderr, "error: out of memory\n"), 1) : 1;
    }
    const float *logits;
    double t0 = cli_now(), t1 = t0, t2;
    int n_out = 0, rc = 1;
    if (n_prompt == 0 || llm_sampler_new(&o->s, m->hp.n_vocab, &smp, err) ||
        llm_session_eval(ses, prompt, n_prompt, &logits, err))
        goto out;
    t1 = cli_now();
    for (int i = 0; i < n_prompt; i++) llm_sampler_accept(smp, prompt[i]);
    for (; n_out < o->n_predict; n_out++) {
        llm_sample_result r;
        if (o->ids)
            gaps[n_out] = top2_gap(logits, m->hp.n_vocab);
        if (llm_sampler_sample(smp, logits, &r, err))
            goto out;
        if (llm_vocab_is_eog(m->vocab, r.id))
            break;
        out[n_out] = r.id;
        llm_sampler_accept(smp, r.id);
        char piece[512];
        int k = llm_token_to_piece(m->vocab, r.id, 0, piece, sizeof piece);
        fwrite(piece, 1, k > (int)sizeof piece ? sizeof piece : (size_t)k, stdout);
        fflush(stdout);
        if (n_out + 1 < o->n_predict && llm_session_eval(ses, &r.id, 1, &logits, err))
            goto out;
    }
    t2 = cli_now();
    printf("\n");
    if (o->ids) {
        print_ids("prompt ids", prompt, n_prompt);
        print_ids("generated ids", out, n_out);
        fprintf(stderr, "top-2 logit gaps:");
        for (int i = 0; i < n_out; i++) fprintf(stderr, " %.3g", gaps[i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "prompt: %d tokens, %.2f tok/s | decode: %d tokens, %.2f tok/s\n", n_prompt,
            n_prompt / (t1 - t0), n_out, n_out > 1 ? (n_out - 1) / (t2 - t1) : 0.0);
    rc = 0;
out:
    if (n_prompt == 0)
        fprintf(stderr, "error: the prompt has no tokens\n");
    llm_sampler_free(smp);
    free(prompt);
    free(out);
    free(gaps);
    return rc;
}

int main(int argc, char **argv)
{
    opts o = {.n_predict = 64, .threads = 0, .ctx = 0, .tp = 1, .lora_scale = 1, .s = llm_sampling_default()};
    o.s.temperature = 0.8f;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b[LLM_MAX_RANKS] = {0};
    llm_session *s = NULL;
    llm_lora *lora = NULL;
    llm_backend_spec spec = {o.backend, (int)o.tp,
                             {.n_threads = (int)o.threads, .force_scalar = o.scalar}, 0};
    long ctx = o.ctx;
    if (llm_model_load(o.model, &m, &err) || llm_backends_open(&spec, b, &err) ||
        (o.lora && llm_lora_load(o.lora, m, 0, &lora, &err)))
        goto fail;
    if (ctx == 0) /* a training context of 128k would reserve gigabytes of KV */
        ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    llm_session_config sc = {.n_ctx = (int)ctx, .max_batch = 512, .kv_type = (int)o.kv_type, .tensor_parallel = (int)o.tp,
                             .tp_backends = b, .lora = lora, .lora_scale = (float)o.lora_scale};
    if (llm_session_new(m, b[0], &sc, &s, &err))
        goto fail;
    rc = generate(&o, m, s, &err);
    if (rc && err.msg[0])
        fprintf(stderr, "error: %s\n", err.msg);
    goto done;
fail:
    fprintf(stderr, "error: %s\n", err.msg);
    rc = 1;
done:
    llm_session_free(s);
    llm_lora_free(lora);
    for (int r = 0; r < LLM_MAX_RANKS; r++) llm_backend_free(b[r]);
    llm_model_free(m);
    return rc;
}
