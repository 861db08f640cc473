/* tp.c - tensor-parallel pieces: cutting a model into per-rank shares and
 * the threads all-reduce the CPU backend uses between ranks. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "llm/tp.h"

/* ---- partition ---------------------------------------------------------- */

static llm_status check_cols(const char *what, const llm_weight *w, int n_ranks, llm_error *err)
{
    size_t be = quant_block_elems(w->type), part = (size_t)w->cols / (size_t)n_ranks;
    if (w->cols % n_ranks || part % be)
        return llm_errf(err, LLM_ERR_UNSUPPORTED,
                        "tensor parallel %d: %s has %lld columns in %s blocks of %zu; each rank's %zu must be whole blocks",
                        n_ranks, what, (long long)w->cols, quant_type_name(w->type), be, part);
    return LLM_OK;
}

llm_status llm_tp_check(const llm_model *m, int n_ranks, llm_error *err)
{
    const llm_hparams *hp = &m->hp;
    if (n_ranks < 1 || n_ranks > LLM_MAX_RANKS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "tensor parallel %d: must be 1 to %d", n_ranks, LLM_MAX_RANKS);
    int ff = hp->n_expert ? hp->n_ff_exp : hp->n_ff; /* a MoE model's MLPs are its experts */
    if (hp->n_head % n_ranks || hp->n_head_kv % n_ranks || ff % n_ranks)
        return llm_errf(err, LLM_ERR_UNSUPPORTED,
                        "tensor parallel %d: the model's heads (%d), KV heads (%d) and %s (%d) must all divide by it",
                        n_ranks, hp->n_head, hp->n_head_kv, hp->n_expert ? "experts' n_ff" : "n_ff", ff);
    llm_status st = LLM_OK;
    for (int l = 0; l < hp->n_layer && !st; l++) {
        const llm_layer *L = &m->layers[l];
        if (!(st = check_cols("attn_output", &L->wo, n_ranks, err)))
            st = hp->n_expert ? check_cols("ffn_down_exps", &L->exp_down[0], n_ranks, err)
                              : check_cols("ffn_down", &L->w_down, n_ranks, err);
    }
    return st;
}

/* Rows [r0, r0 + n) of w, in place. */
static llm_weight row_slice(const llm_weight *w, int64_t r0, int64_t n)
{
    return (llm_weight){w->type, n, w->cols, w->row_bytes, (const char *)w->data + (size_t)r0 * w->row_bytes, NULL};
}

/* Columns [c0, c0 + n) of every row of w into p (whole blocks): *out
 * describes them there. */
static void col_copy(const llm_weight *w, int64_t c0, int64_t n, char *p, llm_weight *out)
{
    size_t rb = quant_row_bytes(w->type, (size_t)n), off = quant_row_bytes(w->type, (size_t)c0);
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(p + (size_t)r * rb, (const char *)w->data + (size_t)r * w->row_bytes + off, rb);
    *out = (llm_weight){w->type, w->rows, n, rb, p, NULL};
}

/* Columns [c0, c0 + n) of every row of w, copied into a new allocation. */
static void *col_slice(const llm_weight *w, int64_t c0, int64_t n, llm_weight *out)
{
    char *p = malloc(quant_row_bytes(w->type, (size_t)n) * (size_t)w->rows);
    if (p)
        col_copy(w, c0, n, p, out);
    return p;
}

static const float *vec_slice(const float *v, size_t off) { return v ? v + off : NULL; }

/* Every expert's share, as a dense MLP's: rows of gate and up, columns
 * of down (copied, one allocation for all of the layer's experts; the
 * three view arrays in one more). owned gets both. */
static int part_experts(const llm_model *m, const llm_layer *L, int rank, int n_ranks, llm_layer *P, void **owned)
{
    int ne = m->hp.n_expert;
    int64_t ff = m->hp.n_ff_exp / n_ranks;
    const llm_weight *d = &L->exp_down[0];
    size_t rb = quant_row_bytes(d->type, (size_t)ff), per = rb * (size_t)d->rows;
    llm_weight *views = owned[0] = malloc(sizeof *views * 3 * (size_t)ne);
    char *down = owned[1] = malloc(per * (size_t)ne);
    if (!views || !down)
        return -1;
    P->exp_gate = views;
    P->exp_up = views + ne;
    P->exp_down = views + 2 * ne;
    for (int e = 0; e < ne; e++) {
        P->exp_gate[e] = row_slice(&L->exp_gate[e], rank * ff, ff);
        P->exp_up[e] = row_slice(&L->exp_up[e], rank * ff, ff);
        col_copy(&L->exp_down[e], rank * ff, ff, down + (size_t)e * per, &P->exp_down[e]);
    }
    return 0;
}

static int part_layer(const llm_model *m, const llm_layer *L, int rank, int n_ranks, llm_layer *P, void **owned)
{
    const llm_hparams *hp = &m->hp;
    int64_t hd = hp->head_dim, qd = hp->n_head / n_ranks * hd, kvd = hp->n_head_kv / n_ranks * hd,
            ff = hp->n_ff / n_ranks;
    *P = *L;
    P->wq = row_slice(&L->wq, rank * qd, qd);
    P->wk = row_slice(&L->wk, rank * kvd, kvd);
    P->wv = row_slice(&L->wv, rank * kvd, kvd);
    P->bq = vec_slice(L->bq, (size_t)(rank * qd));
    P->bk = vec_slice(L->bk, (size_t)(rank * kvd));
    P->bv = vec_slice(L->bv, (size_t)(rank * kvd));
    owned[0] = col_slice(&L->wo, rank * qd, qd, &P->wo);
    if (!owned[0])
        return -1;
    if (m->hp.n_expert)
        return part_experts(m, L, rank, n_ranks, P, owned + 1);
    P->w_gate = row_slice(&L->w_gate, rank * ff, ff);
    P->w_up = row_slice(&L->w_up, rank * ff, ff);
    owned[1] = col_slice(&L->w_down, rank * ff, ff, &P->w_down);
    return owned[1] ? 0 : -1;
}

llm_status llm_tp_partition(const llm_model *m, int rank, int n_ranks, llm_model **out, llm_error *err)
{
    *out = NULL;
    llm_status st = llm_tp_check(m, n_ranks, err);
    if (st)
        return st;
    if (rank < 0 || rank >= n_ranks)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "tensor parallel: rank %d of %d", rank, n_ranks);
    int nl = m->hp.n_layer;
    llm_model *p = calloc(1, sizeof *p);
    if (!p)
        return llm_errf(err, LLM_ERR_NOMEM, "tensor parallel: no memory");
    *p = *m;
    p->gguf = NULL;
    p->vocab = NULL;
    p->hp.n_head /= n_ranks;
    p->hp.n_head_kv /= n_ranks;
    p->hp.n_ff /= n_ranks;
    p->hp.n_ff_exp /= n_ranks;
    p->layers = calloc((size_t)nl, sizeof *p->layers);
    p->owned = calloc((size_t)nl * 3, sizeof *p->owned);
    p->n_owned = p->owned ? nl * 3 : 0;
    int fail = !p->layers || !p->owned;
    for (int l = 0; l < nl && !fail; l++)
        fail = part_layer(m, &m->layers[l], rank, n_ranks, &p->layers[l], &p->owned[3 * l]);
    if (fail) {
        llm_tp_part_free(p);
        return llm_errf(err, LLM_ERR_NOMEM, "tensor parallel: no memory for rank %d's column slices", rank);
    }
    *out = p;
    return LLM_OK;
}

void llm_tp_part_free(llm_model *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_owned; i++) free(p->owned[i]);
    free(p->owned);
    free(p->layers);
    free(p);
}

/* ---- threads all-reduce -------------------------------------------------- */

typedef struct thr_comm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived, aborted;
    unsigned gen;
    float *bufs[LLM_MAX_RANKS];
    size_t lens[LLM_MAX_RANKS];
} thr_comm;

/* Everyone waits for everyone; -1 once a rank aborted. */
static int thr_barrier(thr_comm *t)
{
    pthread_mutex_lock(&t->mu);
    unsigned g = t->gen;
    if (!t->aborted && ++t->arrived == t->n) {
        t->arrived = 0;
        t->gen++;
        pthread_cond_broadcast(&t->cv);
    }
    while (g == t->gen && !t->aborted) pthread_cond_wait(&t->cv, &t->mu);
    int r = t->aborted ? -1 : 0;
    pthread_mutex_unlock(&t->mu);
    return r;
}

static llm_status thr_allreduce(llm_comm *c, int rank, float *buf, size_t n)
{
    thr_comm *t = c->ctx;
    t->bufs[rank] = buf;
    t->lens[rank] = n;
    if (thr_barrier(t))
        return LLM_ERR_CANCELLED;
    for (int r = 0; r < t->n; r++)
        if (t->lens[r] != n) {
            c->iface->abort(c); /* a caller bug: never sum mismatched buffers */
            return LLM_ERR_INTERNAL;
        }
    size_t i0 = n * (size_t)rank / (size_t)t->n, i1 = n * (size_t)(rank + 1) / (size_t)t->n;
    for (size_t i = i0; i < i1; i++) {
        float s = t->bufs[0][i];
        for (int r = 1; r < t->n; r++) s += t->bufs[r][i];
        for (int r = 0; r < t->n; r++) t->bufs[r][i] = s;
    }
    return thr_barrier(t) ? LLM_ERR_CANCELLED : LLM_OK;
}

static void thr_abort(llm_comm *c)
{
    thr_comm *t = c->ctx;
    pthread_mutex_lock(&t->mu);
    t->aborted = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void thr_reset(llm_comm *c)
{
    thr_comm *t = c->ctx;
    pthread_mutex_lock(&t->mu);
    t->aborted = 0;
    t->arrived = 0;
    pthread_mutex_unlock(&t->mu);
}

static void thr_free(llm_comm *c)
{
    thr_comm *t = c->ctx;
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
    free(c);
}

static const struct llm_comm_i thr_iface = {"threads", thr_allreduce, thr_abort, thr_reset, thr_free};

llm_status llm_comm_threads_new(int n_ranks, llm_comm **out, llm_error *err)
{
    *out = NULL;
    if (n_ranks < 1 || n_ranks > LLM_MAX_RANKS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "all-reduce: %d ranks (1 to %d)", n_ranks, LLM_MAX_RANKS);
    llm_comm *c = calloc(1, sizeof *c);
    thr_comm *t = calloc(1, sizeof *t);
    if (!c || !t) {
        free(c);
        free(t);
        return llm_errf(err, LLM_ERR_NOMEM, "all-reduce: no memory");
    }
    if (pthread_mutex_init(&t->mu, NULL) || pthread_cond_init(&t->cv, NULL)) {
        free(c);
        free(t);
        return llm_errf(err, LLM_ERR_BACKEND, "all-reduce: cannot create its mutex");
    }
    t->n = n_ranks;
    *c = (llm_comm){&thr_iface, t, n_ranks};
    *out = c;
    return LLM_OK;
}
