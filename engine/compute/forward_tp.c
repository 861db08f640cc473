/* forward_tp.c - the tensor-parallel driver behind llm_forward_new_tp: one
 * single-rank forward pass per rank over that rank's share of the model,
 * ranks 1..N-1 on threads of their own and rank 0 on the caller's, joined
 * by the communicator after each row-parallel matmul. Only rank 0 computes
 * logits (every rank holds the same residual stream after each
 * all-reduce). */
#include <pthread.h>
#include <stdlib.h>

#include "forward_impl.h"

/* What a rank's thread is started with. */
typedef struct rank_arg {
    tp_group *g;
    int rank;
} rank_arg;

struct tp_group {
    int n, n_layer;
    llm_backend *b[LLM_MAX_RANKS];
    llm_model *part[LLM_MAX_RANKS];
    llm_forward *f[LLM_MAX_RANKS];
    llm_comm *comm;
    pthread_t th[LLM_MAX_RANKS];
    rank_arg arg[LLM_MAX_RANKS];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned job;     /* bumped per forward pass */
    int done, stop;
    llm_forward_batch rest; /* the batch for ranks > 0: no logits */
    const llm_kv_layer *layers;
    llm_status st[LLM_MAX_RANKS];
};

static void *rank_main(void *arg)
{
    tp_group *g = ((rank_arg *)arg)->g;
    int r = ((rank_arg *)arg)->rank;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->job == seen && !g->stop) pthread_cond_wait(&g->cv, &g->mu);
        if (g->stop) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        seen = g->job;
        pthread_mutex_unlock(&g->mu);
        const float *unused;
        llm_status st = llm_forward_eval(g->f[r], &g->rest, g->layers + (size_t)r * g->n_layer, &unused);
        if (st)
            llm_comm_abort(g->comm);
        pthread_mutex_lock(&g->mu);
        g->st[r] = st;
        g->done++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
}

static llm_status start_threads(tp_group *g, llm_error *err)
{
    for (int r = 1; r < g->n; r++) {
        g->arg[r] = (rank_arg){g, r};
        if (pthread_create(&g->th[r], NULL, rank_main, &g->arg[r]))
            return llm_errf(err, LLM_ERR_BACKEND, "tensor parallel: cannot start rank %d's thread", r);
        g->n_threads++;
    }
    return LLM_OK;
}

static llm_status make_comm(tp_group *g, llm_error *err)
{
    const struct llm_backend_i *bi = g->b[0]->iface;
    for (int r = 1; r < g->n; r++)
        if (g->b[r]->iface != bi)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "tensor parallel: rank %d runs %s, rank 0 %s", r,
                            g->b[r]->iface->name, bi->name);
    if (bi->comm_new)
        return bi->comm_new(g->b, g->n, &g->comm, err);
    return llm_comm_threads_new(g->n, &g->comm, err);
}

llm_status tp_group_new(const llm_model *m, llm_backend *const *b, int n_ranks, int max_rows, int max_logits,
                        tp_group **out, llm_error *err)
{
    *out = NULL;
    llm_status st = llm_tp_check(m, n_ranks, err);
    if (st)
        return st;
    tp_group *g = calloc(1, sizeof *g);
    if (!g)
        return llm_errf(err, LLM_ERR_NOMEM, "tensor parallel: no memory");
    g->n = n_ranks;
    g->n_layer = m->hp.n_layer;
    if (pthread_mutex_init(&g->mu, NULL) || pthread_cond_init(&g->cv, NULL)) {
        free(g);
        return llm_errf(err, LLM_ERR_BACKEND, "tensor parallel: cannot create its mutex");
    }
    for (int r = 0; r < n_ranks; r++) g->b[r] = b[r];
    st = make_comm(g, err);
    for (int r = 0; r < n_ranks && !st; r++)
        if (!(st = llm_tp_partition(m, r, n_ranks, &g->part[r], err)) &&
            !(st = llm_forward_new(g->part[r], b[r], max_rows, r ? 1 : max_logits, &g->f[r], err)))
            forward_set_comm(g->f[r], g->comm, r);
    if (!st)
        st = start_threads(g, err);
    if (st) {
        tp_group_free(g);
        return st;
    }
    *out = g;
    return LLM_OK;
}

/* The status to report: a rank's own failure over the cancellations it
 * caused in the others. */
static llm_status first_cause(const tp_group *g)
{
    llm_status any = LLM_OK;
    for (int r = 0; r < g->n; r++) {
        if (g->st[r] && g->st[r] != LLM_ERR_CANCELLED)
            return g->st[r];
        if (g->st[r])
            any = g->st[r];
    }
    return any;
}

int tp_group_device_sample(const tp_group *g) { return llm_forward_device_sample(g->f[0]); }

const float *tp_group_hidden(const tp_group *g) { return llm_forward_hidden(g->f[0]); }

llm_status tp_group_eval(tp_group *g, const llm_forward_batch *bt, const llm_kv_layer *layers, int pick,
                         const llm_sample_params *sp, const float **logits, const int32_t **ids)
{
    pthread_mutex_lock(&g->mu);
    g->rest = *bt;
    g->rest.n_logits = 0;
    g->rest.n_hidden = 0;
    g->layers = layers;
    g->done = 0;
    g->job++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    g->st[0] = forward_eval_mode(g->f[0], bt, layers, pick, sp, logits, ids);
    if (g->st[0])
        llm_comm_abort(g->comm);
    pthread_mutex_lock(&g->mu);
    while (g->done < g->n - 1) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    llm_comm_reset(g->comm);
    return first_cause(g);
}

void tp_group_kv_copy(tp_group *g, const llm_model *m, const llm_kv_layer *layers, llm_kv_copy_layers which,
                      const int32_t *src, const int32_t *dst, int n)
{
    for (int r = 0; r < g->n; r++) forward_kv_copy_on(g->b[r], m, layers + (size_t)r * g->n_layer, which, src, dst, n);
}

void tp_group_free(tp_group *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r <= g->n_threads; r++) pthread_join(g->th[r], NULL);
    for (int r = 0; r < g->n; r++) {
        llm_forward_free(g->f[r]);
        llm_tp_part_free(g->part[r]);
    }
    llm_comm_free(g->comm);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
