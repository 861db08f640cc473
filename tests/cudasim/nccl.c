/* nccl.c - NCCL's all-reduce over the emulated devices of one process
 * (ncclCommInitAll: one communicator per device, the clique of them).
 *
 * ncclAllReduce is queued on the rank's stream. When a rank's stream gets
 * to it, the rank contributes a copy of its buffer; when the last rank
 * has, the sum is formed in rank order (every rank gets the same bits)
 * and written to every rank's output, and each rank's stream goes on. A
 * stream whose collective waits for peers runs the peers' queued work
 * itself (a device does not wait for its host), then waits for their
 * hosts to enqueue theirs. ncclCommAbort completes waiting collectives
 * without a result. Only float sums are emulated (what the backend uses);
 * other types and operations are ncclInvalidArgument. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"
#include "sim.h"

#define MAX_INFLIGHT 8

typedef struct coll {
    uint64_t seq;
    int contributed;
    size_t count;
    float *data[SIM_MAX_DEVS];
    sim_op *op[SIM_MAX_DEVS];
} coll;

typedef struct clique {
    int n, aborted;
    int live;     /* communicators not destroyed */
    int structs;  /* communicator structs not freed (queued ops may outlive ncclCommDestroy) */
    struct ncclComm *comm[SIM_MAX_DEVS];
    coll inflight[MAX_INFLIGHT];
} clique;

struct ncclComm {
    clique *c;
    int rank, dev;
    uint64_t next_seq;
    sim_stream *last_stream; /* where this rank's collectives are queued */
    int refs;                /* queued all-reduces naming it */
    int gone;                /* destroyed or aborted by its owner: freed when refs drops to 0 */
};

typedef struct ar_op {
    struct ncclComm *comm;
    const float *send;
    float *recv;
    size_t count;
    uint64_t seq;
} ar_op;

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    sim_lock();
    int bad = sim_prologue() != cudaSuccess || !comms || ndev < 1 || ndev > sim.n_devs;
    for (int i = 0; !bad && i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        bad = d < 0 || d >= sim.n_devs;
        for (int j = 0; j < i && !bad; j++) bad = (devlist ? devlist[j] : j) == d; /* one rank per device */
    }
    clique *c = bad ? NULL : calloc(1, sizeof *c);
    for (int i = 0; c && i < ndev; i++) {
        c->comm[i] = calloc(1, sizeof *c->comm[i]);
        if (!c->comm[i]) {
            for (int j = 0; j < i; j++) free(c->comm[j]);
            free(c);
            c = NULL;
            break;
        }
        *c->comm[i] = (struct ncclComm){c, i, devlist ? devlist[i] : i, 0, NULL, 0, 0};
    }
    if (c) {
        c->n = c->live = c->structs = ndev;
        for (int i = 0; i < ndev; i++) comms[i] = c->comm[i];
    }
    sim_unlock();
    return bad ? ncclInvalidArgument : c ? ncclSuccess : ncclSystemError;
}

static void comm_free(struct ncclComm *comm)
{
    clique *c = comm->c;
    free(comm);
    if (--c->structs == 0) {
        for (int i = 0; i < MAX_INFLIGHT; i++)
            for (int r = 0; r < c->n; r++) free(c->inflight[i].data[r]);
        free(c);
    }
}

/* The owner is done with comm; all-reduces still queued on its stream
 * keep the struct until they are dropped (they then do nothing). */
static void clique_release(struct ncclComm *comm)
{
    clique *c = comm->c;
    c->comm[comm->rank] = NULL;
    c->live--;
    comm->gone = 1;
    if (!comm->refs)
        comm_free(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    sim_lock();
    clique_release(comm);
    sim_unlock();
    return ncclSuccess;
}

static void finish_all(clique *c, coll *k, int write)
{
    for (int r = 0; r < c->n; r++)
        if (k->op[r]) {
            if (write) {
                ar_op *a = SIM_PAYLOAD(k->op[r], ar_op);
                for (size_t i = 0; i < k->count; i++) {
                    float s = 0.f;
                    for (int q = 0; q < c->n; q++)
                        if (k->data[q])
                            s += k->data[q][i];
                    a->recv[i] = s;
                }
            }
            k->op[r]->state = 2;
        }
    for (int r = 0; r < c->n; r++) {
        free(k->data[r]);
        k->data[r] = NULL;
        k->op[r] = NULL;
    }
    k->contributed = 0;
    k->seq = 0;
    pthread_cond_broadcast(&sim.cv);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    sim_lock();
    clique *c = comm->c;
    c->aborted = 1;
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->inflight[i].contributed)
            finish_all(c, &c->inflight[i], 0);
    clique_release(comm);
    sim_unlock();
    return ncclSuccess;
}

static coll *coll_for(clique *c, uint64_t seq)
{
    coll *free_slot = NULL;
    for (int i = 0; i < MAX_INFLIGHT; i++) {
        if (c->inflight[i].contributed && c->inflight[i].seq == seq)
            return &c->inflight[i];
        if (!c->inflight[i].contributed && !free_slot)
            free_slot = &c->inflight[i];
    }
    if (free_slot)
        free_slot->seq = seq;
    return free_slot;
}

static void ar_run(sim_op *op)
{
    ar_op *a = SIM_PAYLOAD(op, ar_op);
    clique *c = a->comm->c;
    op->state = 2;
    if (c->aborted || a->comm->gone)
        return;
    coll *k = coll_for(c, a->seq);
    if (!k) {
        sim_fault(cudaErrorLaunchFailure, "ncclAllReduce: more than %d collectives in flight", MAX_INFLIGHT);
        return;
    }
    if (k->contributed && k->count != a->count) {
        sim_fault(cudaErrorLaunchFailure, "ncclAllReduce #%llu: rank %d reduces %zu floats, another rank %zu",
                  (unsigned long long)a->seq, a->comm->rank, a->count, k->count);
        return;
    }
    k->count = a->count;
    k->data[a->comm->rank] = malloc(sizeof(float) * (a->count ? a->count : 1));
    if (!k->data[a->comm->rank]) {
        sim_fault(cudaErrorMemoryAllocation, "ncclAllReduce: no host memory");
        return;
    }
    memcpy(k->data[a->comm->rank], a->send, sizeof(float) * a->count);
    k->op[a->comm->rank] = op;
    op->state = 1;
    if (++k->contributed == c->live)
        finish_all(c, k, 1);
}

static void ar_drop(sim_op *op)
{
    struct ncclComm *comm = SIM_PAYLOAD(op, ar_op)->comm;
    if (--comm->refs == 0 && comm->gone)
        comm_free(comm);
}

static const sim_op_kind ar_kind = {"ncclAllReduce", ar_run, ar_drop, NULL, NULL};

/* The peers' queued work, up to their part in op's collective. */
int sim_nccl_progress(sim_op *op)
{
    ar_op *a = SIM_PAYLOAD(op, ar_op);
    clique *c = a->comm->c;
    for (int r = 0; r < c->n && op->state == 1; r++) {
        sim_stream *s = c->comm[r] ? c->comm[r]->last_stream : NULL;
        if (r == a->comm->rank || !s || s->executing)
            continue;
        s->executing = 1;
        s->exec_owner = pthread_self();
        while (s->head && !(s->head->k == &ar_kind && s->head->state == 1))
            if (sim_run_head(s))
                break;
        s->executing = 0;
        pthread_cond_broadcast(&sim.cv); /* a thread may wait to run this queue itself */
    }
    return op->state == 2 ? 0 : 1;
}

/* 0, or why this all-reduce cannot be queued. */
static ncclResult_t ar_refused(const void *send, const void *recv, size_t count, ncclComm_t comm, const sim_stream *s)
{
    if (comm->gone)
        return ncclInvalidUsage;
    if (sim_prologue() || sim_injected("ncclAllReduce"))
        return ncclUnhandledCudaError;
    if (!s || s->dev != comm->dev || sim_device_ptr(send, count * 4, comm->dev, "ncclAllReduce send buffer") ||
        sim_device_ptr(recv, count * 4, comm->dev, "ncclAllReduce receive buffer"))
        return ncclInvalidArgument;
    return s->capturing ? ncclInvalidUsage : ncclSuccess; /* not emulated: collectives inside graphs */
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t redop,
                           ncclComm_t comm, cudaStream_t st)
{
    if (!comm || type != ncclFloat || redop != ncclSum)
        return ncclInvalidArgument;
    sim_lock();
    sim_stream *s = (sim_stream *)st;
    ncclResult_t res = ar_refused(send, recv, count, comm, s);
    sim_op *op = res ? NULL : sim_op_new(&ar_kind, sizeof(ar_op));
    if (!res && !op)
        res = ncclSystemError;
    if (op) {
        *SIM_PAYLOAD(op, ar_op) = (ar_op){comm, send, recv, count, ++comm->next_seq};
        comm->last_stream = s;
        comm->refs++;
        sim_enqueue(s, op);
    }
    sim_unlock();
    return res;
}
