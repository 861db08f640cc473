/* cpu_pack.c - the CPU backend's copy of a model (model_upload): the same
 * tensors, plus packed copies of the dense matrices its kernel set tiles
 * (kernels.h, cpu_pack), made once on the backend's threads.
 *
 * Memory: the packed copies are as large as the matrices they replace, so
 * packing must not make a model that ran unpacked fail to load or get its
 * pod killed: it is skipped (the model runs unpacked, with a log line
 * saying why) when the copies would not fit in MemAvailable or in the
 * room the process's cgroups (v1 or v2, up to the root) leave, or when
 * its matrices' bytes overlap (a small hostile file would otherwise cost
 * a copy per repeat; identical repeats, such as a tied output, share
 * one copy). Once packed,
 * the mapping's pages of those matrices are only read again through the
 * unpacked path (never, for this backend), so they are handed back to the
 * kernel with MADV_PAGEOUT: the process's resident memory stays about one
 * model, not two. Page-out is advice: data stays intact (a file mapping is
 * re-read, anonymous memory is swapped or kept). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "llm/log.h"
#include "llm/model.h"

/* The copy; m comes first: model_release gets &m. */
typedef struct cpu_model {
    llm_model m;
    llm_layer *layers;
    void *packed;
    size_t bytes;
} cpu_model;

typedef struct pack_job {
    const cpu_kernels *k;
    llm_weight **w;
    int n;
    size_t *off;  /* (n) each weight's bytes into base */
    long *first;  /* (n + 1) each weight's first group in the job's numbering (none for a repeat) */
    int *same;    /* (n) an earlier weight with the same data and shape (its copy is shared), or -1 */
    char *base;
} pack_job;

/* The matrices of m that k packs (MoE experts stay as they are); out may
 * be NULL to count them. */
static int packable(llm_model *m, const cpu_kernels *k, llm_weight **out)
{
    int n = 0;
    for (int l = 0; l <= m->hp.n_layer; l++) {
        llm_layer *L = l < m->hp.n_layer ? &m->layers[l] : NULL;
        llm_weight *w[] = {L ? &L->wq : &m->output, L ? &L->wk : NULL, L ? &L->wv : NULL, L ? &L->wo : NULL,
                           L ? &L->w_gate : NULL, L ? &L->w_up : NULL, L ? &L->w_down : NULL};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++)
            if (w[i] && w[i]->data && w[i]->rows > 0 && k->pack[w[i]->type]) {
                if (out)
                    out[n] = w[i];
                n++;
            }
    }
    return n;
}

/* Every weight's groups, split evenly over the pool's threads. */
static void pack_worker(void *arg, int ith, int nth)
{
    pack_job *j = arg;
    long lo, hi;
    tp_range(j->first[j->n], ith, nth, &lo, &hi);
    for (int i = 0; i < j->n && lo < hi; i++) {
        const llm_weight *w = j->w[i];
        long a = lo > j->first[i] ? lo : j->first[i], b = hi < j->first[i + 1] ? hi : j->first[i + 1];
        if (a < b)
            j->k->pack[w->type]->pack(w->data, w->row_bytes, w->rows, w->cols, a - j->first[i], b - j->first[i],
                                      j->base + j->off[i]);
    }
}

/* A number from a cgroup file (key NULL: its first word; else the value
 * of the line "key N"); -1 when missing or "max". */
static long long cgroup_value(const char *dir, const char *file, const char *key)
{
    char path[4200], line[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    long long v = -1;
    size_t klen = key ? strlen(key) : 0;
    while (f && fgets(line, sizeof line, f)) {
        if (key && (strncmp(line, key, klen) || line[klen] != ' '))
            continue;
        if (sscanf(line + klen, "%lld", &v) != 1)
            v = -1;
        break;
    }
    if (f)
        fclose(f);
    return v;
}

/* The least memory any cgroup from this process's up to the root leaves
 * beyond its anonymous memory (v2: memory.max - anon; v1:
 * memory.limit_in_bytes - total_rss; the page cache is reclaimed before a
 * limit bites); 0 when no limit is found. */
static size_t cgroup_left(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[4096], dir[4200] = "";
    int v1 = 0;
    while (f && fgets(line, sizeof line, f)) { /* "0::/path" (v2) or "N:...memory...:/path" (v1) */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        line[strcspn(line, "\n")] = 0;
        *c2 = 0;
        int is_v1 = strstr(c1 + 1, "memory") != NULL, is_v2 = c1[1] == 0;
        if (is_v1 || (is_v2 && !v1)) {
            snprintf(dir, sizeof dir, "/sys/fs/cgroup%s%s", is_v1 ? "/memory" : "", c2 + 1);
            v1 = is_v1;
        }
    }
    if (f)
        fclose(f);
    size_t root = strlen(v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup"), least = 0;
    while (dir[0]) {
        long long max = cgroup_value(dir, v1 ? "memory.limit_in_bytes" : "memory.max", NULL);
        long long anon = cgroup_value(dir, "memory.stat", v1 ? "total_rss" : "anon");
        if (max > 0 && max < (1LL << 60) && anon >= 0) {
            size_t left = max > anon ? (size_t)(max - anon) : 1;
            least = least && least < left ? least : left;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < root)
            break;
        *slash = 0; /* the parent */
    }
    return least;
}

/* What packing may take: MemAvailable (which counts the page cache, the
 * model's mapping included, as free) or the cgroups' room if less, less
 * an eighth for what is reserved but not yet touched (another engine's KV
 * pool); 0 when unknown. */
static size_t budget(llm_backend *b)
{
    size_t avail = cpu_mem_available(b), left = cgroup_left();
    if (left && (!avail || left < avail))
        avail = left;
    return avail - avail / 8;
}

/* The whole pages of w's rows in the mapping, back to the kernel, unless
 * they overlap the token embedding (read every step). */
static void page_out(const llm_weight *w, const llm_weight *emb)
{
#ifdef MADV_PAGEOUT
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)w->data, hi = lo + (size_t)w->rows * w->row_bytes;
    uintptr_t elo = (uintptr_t)emb->data, ehi = elo + (size_t)emb->rows * emb->row_bytes;
    if (page <= 0 || (lo < ehi && elo < hi))
        return;
    lo = (lo + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    hi = hi / (uintptr_t)page * (uintptr_t)page;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_PAGEOUT); /* advice: a kernel without it changes nothing */
#else
    (void)w, (void)emb;
#endif
}

static int same_weight(const llm_weight *a, const llm_weight *b)
{
    return a->data == b->data && a->type == b->type && a->rows == b->rows && a->cols == b->cols &&
           a->row_bytes == b->row_bytes;
}

static int by_start(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)(*(llm_weight *const *)a)->data, y = (uintptr_t)(*(llm_weight *const *)b)->data;
    return x < y ? -1 : x > y;
}

/* 1 when two of the n distinct weights' bytes overlap (sorts w): a file
 * whose tensors share data would make packing copy the same bytes many
 * times (a small file costing the memory of a large one). */
static int overlapping(llm_weight **w, int n)
{
    qsort(w, (size_t)n, sizeof *w, by_start);
    for (int i = 1; i < n; i++)
        if ((uintptr_t)w[i]->data < (uintptr_t)w[i - 1]->data + (size_t)w[i - 1]->rows * w[i - 1]->row_bytes)
            return 1;
    return 0;
}

/* Sizes the packed copies of pj's n weights into *total: offsets and
 * group numbering; a weight equal to an earlier one (a tied or repeated
 * tensor) shares its copy. *total SIZE_MAX when distinct weights overlap. */
static llm_status layout(const cpu_kernels *k, pack_job *pj, size_t *total_out, llm_error *err)
{
    size_t total = 0;
    int n_distinct = 0;
    llm_weight **distinct = malloc(sizeof *distinct * (size_t)pj->n);
    if (!distinct)
        return llm_errf(err, LLM_ERR_NOMEM, "cpu backend: no memory to lay out packed weights");
    for (int i = 0; i < pj->n; i++) {
        const cpu_pack *pk = k->pack[pj->w[i]->type];
        pj->same[i] = -1;
        for (int j = 0; j < i && pj->same[i] < 0; j++)
            if (pj->same[j] < 0 && same_weight(pj->w[i], pj->w[j]))
                pj->same[i] = j;
        pj->first[i + 1] = pj->first[i];
        if (pj->same[i] >= 0) {
            pj->off[i] = pj->off[pj->same[i]];
            continue;
        }
        distinct[n_distinct++] = pj->w[i];
        pj->off[i] = total;
        pj->first[i + 1] += (pj->w[i]->rows + pk->group - 1) / pk->group;
        total += (pk->bytes(pj->w[i]->rows, pj->w[i]->cols) + 63) / 64 * 64;
    }
    *total_out = overlapping(distinct, n_distinct) ? SIZE_MAX : total;
    free(distinct);
    return LLM_OK;
}

/* Fills cm->packed with pj's weights, or leaves it NULL (saying why) when
 * they would not fit the memory left; LLM_ERR_NOMEM when they should have
 * but the allocation failed (a transient shortage: the load fails rather
 * than run unpacked, whose results differ in their last bits). */
static llm_status pack_all(llm_backend *b, cpu_ctx *c, cpu_model *cm, pack_job *pj, const llm_model *host,
                           llm_error *err)
{
    size_t total = 0, avail = budget(b);
    llm_status st = layout(c->k, pj, &total, err);
    if (st)
        return st;
    int must = c->pack == LLM_CPU_PACK_ON;
    if (total == SIZE_MAX) {
        if (must)
            return llm_errf(err, LLM_ERR_NOMEM, "cpu backend: cpu_pack on, but %s's matrices' bytes overlap (it can "
                            "only run unpacked)", host->name);
        llm_log("llm-engine", "cpu backend: %s runs unpacked (its matrices' bytes overlap)", host->name);
        return LLM_OK;
    }
    if (avail && total > avail) {
        if (must)
            return llm_errf(err, LLM_ERR_NOMEM, "cpu backend: cpu_pack on, but the %s set's tiled copies of %s need "
                            "%zu MiB and %zu MiB are free to this process", c->k->name, host->name, total >> 20,
                            avail >> 20);
        llm_log("llm-engine", "cpu backend: %s runs unpacked (the %s set's tiled copies need %zu MiB; %zu MiB are "
                "free to this process)", host->name, c->k->name, total >> 20, avail >> 20);
        return LLM_OK;
    }
    cm->packed = aligned_alloc(64, total);
    if (!cm->packed)
        return llm_errf(err, LLM_ERR_NOMEM, "cpu backend: no memory for the %s set's %zu MiB of tiled copies of %s",
                        c->k->name, total >> 20, host->name);
    cm->bytes = total;
    pj->base = cm->packed;
    tp_run(c->pool, pack_worker, pj);
    for (int i = 0; i < pj->n; i++) {
        pj->w[i]->packed = pj->base + pj->off[i];
        if (pj->same[i] < 0)
            page_out(pj->w[i], &host->tok_embd);
    }
    atomic_fetch_add(&c->used, total);
    return LLM_OK;
}

void cpu_pack_release(llm_backend *b, llm_model *dev)
{
    cpu_model *cm = (cpu_model *)dev;
    if (!cm)
        return;
    atomic_fetch_sub(&((cpu_ctx *)b->ctx)->used, cm->bytes);
    free(cm->packed);
    free(cm->layers);
    free(cm);
}

/* *dev stays NULL (the model used in place) when the set packs nothing of
 * m or the copies would not fit; LLM_ERR_NOMEM when an allocation fails. */
llm_status cpu_pack_model(llm_backend *b, const llm_model *m, llm_model **dev, llm_error *err)
{
    cpu_ctx *c = b->ctx;
    *dev = NULL;
    int n = packable((llm_model *)m, c->k, NULL); /* counting only: m is not written */
    if (!n)
        return LLM_OK;
    if (c->pack == LLM_CPU_PACK_OFF) {
        llm_log("llm-engine", "cpu backend: %s runs unpacked (cpu_pack off)", m->name);
        return LLM_OK;
    }
    llm_status st = LLM_OK;
    cpu_model *cm = calloc(1, sizeof *cm);
    llm_layer *layers = calloc((size_t)m->hp.n_layer + 1, sizeof *layers); /* + 1: never a zero-size request */
    pack_job pj = {c->k, calloc((size_t)n, sizeof *pj.w), n, calloc((size_t)n, sizeof *pj.off),
                   calloc((size_t)n + 1, sizeof *pj.first), calloc((size_t)n, sizeof *pj.same), NULL};
    if (!cm || !layers || !pj.w || !pj.off || !pj.first || !pj.same) {
        free(cm);
        free(layers);
        st = llm_errf(err, LLM_ERR_NOMEM, "cpu backend: no memory to copy %s", m->name);
        goto out;
    }
    cm->m = *m;
    memcpy(layers, m->layers, sizeof *layers * (size_t)m->hp.n_layer);
    cm->m.layers = cm->layers = layers;
    cm->m.owned = NULL; /* the host model still owns them */
    cm->m.n_owned = 0;
    packable(&cm->m, c->k, pj.w);
    st = pack_all(b, c, cm, &pj, m, err);
    if (cm->packed)
        *dev = &cm->m;
    else
        cpu_pack_release(b, &cm->m);
out:
    free(pj.w);
    free(pj.off);
    free(pj.first);
    free(pj.same);
    return st;
}
