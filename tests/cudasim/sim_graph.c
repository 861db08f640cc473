/* sim_graph.c - stream capture and CUDA graphs on the emulator.
 *
 * A capturing stream records what is enqueued on it instead of queueing
 * it; the thread that began a thread-local or global capture may not make
 * unsafe calls (allocation, synchronous copies, synchronisation): they
 * fail with cudaErrorStreamCaptureUnsupported and invalidate the capture,
 * as cudaThreadExchangeStreamCaptureMode documents. A captured graph is
 * a list of ops; instantiation copies it, and each launch runs a fresh
 * copy in stream order (kernel arguments as captured, pinned host memory
 * read when the launch runs). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static __thread sim_stream *tl_capture; /* a capture this thread began (not relaxed) */

void sim_capture_forget(void) { tl_capture = NULL; }

void sim_capture_invalidate(sim_stream *s, const char *why)
{
    if (s && s->capturing && !s->capture_bad) {
        s->capture_bad = 1;
        s->capture_why = why;
    }
}

/* An unsafe call made by a thread with a capture in progress: refused, the
 * capture invalidated (cudaThreadExchangeStreamCaptureMode's rules). */
int sim_capture_refuses(const char *call)
{
    if (!tl_capture || !tl_capture->capturing)
        return 0;
    sim_capture_invalidate(tl_capture, call);
    return 1;
}
int sim_graph_add(sim_graph *g, sim_op *op)
{
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        if (cap > SIM_MAX_TABLE)
            return -1;
        sim_op **n = realloc(g->nodes, sizeof *n * (size_t)cap);
        if (!n)
            return -1;
        g->nodes = n;
        g->cap = cap;
    }
    g->nodes[g->n++] = op;
    return 0;
}

static void graph_free(sim_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++) sim_op_free(g->nodes[i]);
    free(g->nodes);
    free(g);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode)
{
    ENTER();
    sim_stream *s = sim_stream_of(st);
    if (s->legacy)
        LEAVE(cudaErrorStreamCaptureUnsupported); /* the NULL stream cannot be captured */
    if (s->capturing)
        LEAVE(cudaErrorIllegalState);
    if (mode > cudaStreamCaptureModeRelaxed)
        LEAVE(cudaErrorInvalidValue);
    s->graph = calloc(1, sizeof *s->graph);
    if (!s->graph)
        LEAVE(cudaErrorMemoryAllocation);
    s->capturing = 1;
    s->capture_bad = 0;
    s->capture_why = NULL;
    s->capture_thread = pthread_self();
    s->capture_mode = mode;
    if (mode != cudaStreamCaptureModeRelaxed)
        tl_capture = s;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *out)
{
    ENTER();
    sim_stream *s = sim_stream_of(st);
    if (!out)
        LEAVE(cudaErrorInvalidValue);
    *out = NULL;
    if (!s->capturing)
        LEAVE(cudaErrorIllegalState);
    if (s->capture_mode != cudaStreamCaptureModeRelaxed && !pthread_equal(s->capture_thread, pthread_self()))
        LEAVE(cudaErrorStreamCaptureWrongThread);
    s->capturing = 0;
    if (tl_capture == s)
        tl_capture = NULL;
    if (s->capture_bad) {
        graph_free(s->graph);
        s->graph = NULL;
        LEAVE(cudaErrorStreamCaptureInvalidated);
    }
    *out = (cudaGraph_t)s->graph;
    s->graph = NULL;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status)
{
    ENTER();
    sim_stream *s = sim_stream_of(st);
    *status = !s->capturing ? cudaStreamCaptureStatusNone
              : s->capture_bad ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
    LEAVE(cudaSuccess);
}

static sim_op *op_clone(const sim_op *op)
{
    sim_op *c = malloc(op->size);
    if (!c)
        return NULL;
    memcpy(c, op, op->size);
    c->next = NULL;
    c->state = 0;
    if (op->k->clone && op->k->clone(op, c)) {
        free(c);
        return NULL;
    }
    return c;
}

static sim_graph *graph_copy(const sim_graph *g)
{
    sim_graph *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    for (int i = 0; i < g->n; i++) {
        sim_op *n = op_clone(g->nodes[i]);
        if (!n || sim_graph_add(c, n)) {
            if (n)
                sim_op_free(n);
            graph_free(c);
            return NULL;
        }
    }
    return c;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    ENTER();
    if (!exec || !g || flags)
        LEAVE(cudaErrorInvalidValue);
    sim_graph *c = graph_copy((sim_graph *)g);
    *exec = (cudaGraphExec_t)c;
    LEAVE(c ? cudaSuccess : cudaErrorMemoryAllocation);
}

/* A launched graph: its own copy of the nodes, run in order. While it
 * waits in its stream, its copies count as queued work on what they touch
 * (hazards, pinned memory's protection), like copies queued one by one. */
typedef struct graph_op {
    sim_graph *g;
    int ran;          /* nodes already run (their counts are given back) */
} graph_op;

static void node_pending(sim_op *n, int add)
{
    if (n->k->targets)
        sim_pending_note(n, add);
}

static void graph_run(sim_op *op)
{
    graph_op *go = SIM_PAYLOAD(op, graph_op);
    sim.stats.graphs++;
    for (; go->ran < go->g->n && !sim.sticky; go->ran++) {
        sim_op *n = go->g->nodes[go->ran];
        node_pending(n, -1);
        n->k->run(n);
    }
}

static void graph_drop(sim_op *op)
{
    graph_op *go = SIM_PAYLOAD(op, graph_op);
    for (; go->ran < go->g->n; go->ran++) node_pending(go->g->nodes[go->ran], -1);
    graph_free(go->g);
}

static const sim_op_kind graph_kind = {"graph", graph_run, graph_drop, NULL, NULL};

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st)
{
    ENTER();
    if (!exec)
        LEAVE(cudaErrorInvalidValue);
    sim_stream *s = sim_stream_of(st);
    sim_op *op = sim_op_new(&graph_kind, sizeof(graph_op));
    sim_graph *g = op ? graph_copy((sim_graph *)exec) : NULL;
    if (!g) {
        free(op);
        LEAVE(cudaErrorMemoryAllocation);
    }
    SIM_PAYLOAD(op, graph_op)->g = g;
    for (int i = 0; i < g->n; i++) {
        sim_op *n = g->nodes[i];
        n->stream = s;
        if (n->k->targets) {
            n->k->targets(n);
            node_pending(n, 1);
        }
    }
    if (s->capturing) { /* a graph launched into a capture: not emulated */
        graph_drop(op);
        free(op);
        sim_capture_invalidate(s, "cudaGraphLaunch into a capture");
        LEAVE(cudaErrorStreamCaptureUnsupported);
    }
    sim_enqueue(s, op);
    LEAVE(cudaSuccess);
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    sim_lock();
    graph_free((sim_graph *)g);
    sim_unlock();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    sim_lock();
    graph_free((sim_graph *)exec);
    sim_unlock();
    return cudaSuccess;
}

