/* cpu_lora.c - the CPU backend's LoRA op (llm_backend_i.lora): for each
 * row of a segment, t = A x (rank dot products), u = B t (the rank rows
 * of B transposed, weighted by t, summed in k order), y += s u. A and B
 * are read in their stored type (F32 or F16) by the kernel set's float
 * dot and weighted-sum kernels (those attention uses on K/V rows).
 *
 * Work is split into units of one row and a strip of at most
 * LORA_STRIP outputs; each thread takes a contiguous run of units, so a
 * decode step of 16 rows keeps both threads of a 2-core machine busy and
 * one long prompt splits the same way. A unit recomputes t for its row
 * unless the thread's previous unit was the same row: the arithmetic of
 * t, of each u[o] and of y[o] is the same whatever unit, thread or batch
 * computes it. */
#include <string.h>

#include "cpu_impl.h"

#define LORA_STRIP 512        /* outputs per unit: u stays on the stack, B's strip in L1 */
#define LORA_PAR_MIN (1 << 16) /* multiply-adds below which one thread does it all */

typedef struct lora_job {
    const cpu_kernels *k;
    cpu_dot_fn dot32, dot16; /* A's rows */
    cpu_wsum_kv_fn wsum16;    /* B's F16 rows (F32 ones: k->attn_wsum) */
    const llm_lora_seg *segs;
    int n_segs, in, out, strips;
    const float *x;
    float *y;
    long units; /* sum of n_rows * strips */
} lora_job;

/* Unit u's segment and row: segments are walked from the hint (units
 * come in order within a thread). */
static void unit_at(const lora_job *j, long u, int *seg, long *seg_unit0, int *row, int *strip)
{
    while (u - *seg_unit0 >= (long)j->segs[*seg].n_rows * j->strips) {
        *seg_unit0 += (long)j->segs[*seg].n_rows * j->strips;
        (*seg)++;
    }
    long in_seg = u - *seg_unit0;
    *row = j->segs[*seg].row0 + (int)(in_seg / j->strips);
    *strip = (int)(in_seg % j->strips);
}

static void lora_worker(void *arg, int ith, int nth)
{
    const lora_job *j = arg;
    const cpu_kernels *k = j->k;
    long lo, hi;
    tp_range(j->units, ith, nth, &lo, &hi);
    int seg = 0, last_row = -1;
    long seg_unit0 = 0;
    float t[LLM_LORA_SEG_MAX_RANK], u[LORA_STRIP];
    for (long un = lo; un < hi; un++) {
        int row, strip;
        unit_at(j, un, &seg, &seg_unit0, &row, &strip);
        const llm_lora_seg *s = &j->segs[seg];
        const float *xr = j->x + (size_t)row * j->in;
        if (row != last_row) {
            int h = s->a_type == QT_F16;
            size_t rb = quant_row_bytes(s->a_type, (size_t)j->in);
            for (int r = 0; r < s->rank; r++) t[r] = (h ? j->dot16 : j->dot32)((const char *)s->a + r * rb, xr, j->in);
            last_row = row;
        }
        int o0 = strip * LORA_STRIP, n = j->out - o0 < LORA_STRIP ? j->out - o0 : LORA_STRIP;
        memset(u, 0, sizeof(float) * (size_t)n);
        if (s->b_type == QT_F16)
            j->wsum16(u, t, (const quant_f16 *)s->bt + o0, (size_t)j->out * sizeof(quant_f16), s->rank, n);
        else
            k->attn_wsum(u, t, (const float *)s->bt + o0, (size_t)j->out, s->rank, n);
        k->axpy(j->y + (size_t)row * j->out + o0, s->s, u, n);
    }
}

/* The set's dot for type t, or the scalar set's where the set lacks it
 * or reads t's activations in another format than float. */
static cpu_dot_fn dot_for(const cpu_kernels *k, quant_type t)
{
    return k->dot[t] && k->act[t]->kind == cpu_act_f32.kind ? k->dot[t] : cpu_kernels_scalar()->dot[t];
}

llm_status cpu_lora(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in, float *y, int out)
{
    cpu_ctx *c = b->ctx;
    const cpu_kernels *k = c->k;
    lora_job j = {k, dot_for(k, QT_F32), dot_for(k, QT_F16),
                  k->attn_wsum_kv[QT_F16] ? k->attn_wsum_kv[QT_F16] : cpu_kernels_scalar()->attn_wsum_kv[QT_F16],
                  segs, n_segs, in, out, (out + LORA_STRIP - 1) / LORA_STRIP, x, y, 0};
    long work = 0;
    for (int i = 0; i < n_segs; i++) { /* ranks and counts checked by llm_backend_lora */
        j.units += (long)segs[i].n_rows * j.strips;
        work += (long)segs[i].n_rows * segs[i].rank * (in + out);
    }
    if (j.units == 0)
        return LLM_OK;
    if (work < LORA_PAR_MIN)
        lora_worker(&j, 0, 1);
    else
        tp_run(c->pool, lora_worker, &j);
    return LLM_OK;
}
