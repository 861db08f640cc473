/* gguf_writer.c - GGUF v3 serialisation (see gguf_writer.h). Metadata is
 * encoded into one growing byte buffer as it is set; tensors are laid out
 * at write time with 32-byte alignment. */
#include "llm/gguf_writer.h"

#include <errno.h>
#include <string.h>

#define ALIGN 32

typedef struct wtensor {
    char *name;
    quant_type type;
    int n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
} wtensor;

struct gguf_writer {
    uint8_t *meta;
    size_t meta_n, meta_cap;
    uint64_t n_kv;
    wtensor *t;
    int n_t, cap_t;
    int oom;
};

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->meta);
    free(w);
}

static void put(gguf_writer *w, const void *p, size_t n)
{
    if (w->oom)
        return;
    if (w->meta_n + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_n + n) cap *= 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m) {
            w->oom = 1;
            return;
        }
        w->meta = m;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_n, p, n);
    w->meta_n += n;
}

static void put_str(gguf_writer *w, const char *s)
{
    uint64_t n = strlen(s);
    put(w, &n, 8);
    put(w, s, n);
}

static void put_u32(gguf_writer *w, uint32_t v) { put(w, &v, 4); }

static llm_status kv_head(gguf_writer *w, const char *key, gguf_type t)
{
    put_str(w, key);
    put_u32(w, t);
    w->n_kv++;
    return w->oom ? LLM_ERR_NOMEM : LLM_OK;
}

#define SETTER(fn, ctype, gt)                                            \
    llm_status fn(gguf_writer *w, const char *key, ctype v)              \
    {                                                                    \
        kv_head(w, key, gt);                                             \
        put(w, &v, sizeof v);                                            \
        return w->oom ? LLM_ERR_NOMEM : LLM_OK;                          \
    }
SETTER(gguf_writer_u32, uint32_t, GGUF_TYPE_UINT32)
SETTER(gguf_writer_i32, int32_t, GGUF_TYPE_INT32)
SETTER(gguf_writer_f32, float, GGUF_TYPE_FLOAT32)
#undef SETTER

llm_status gguf_writer_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    kv_head(w, key, GGUF_TYPE_BOOL);
    put(w, &b, 1);
    return w->oom ? LLM_ERR_NOMEM : LLM_OK;
}

llm_status gguf_writer_str(gguf_writer *w, const char *key, const char *v)
{
    kv_head(w, key, GGUF_TYPE_STRING);
    put_str(w, v);
    return w->oom ? LLM_ERR_NOMEM : LLM_OK;
}

static size_t elem_size(gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

llm_status gguf_writer_arr(gguf_writer *w, const char *key, gguf_type t, const void *data, uint64_t n)
{
    if (!elem_size(t))
        return LLM_ERR_INVALID_ARG;
    kv_head(w, key, GGUF_TYPE_ARRAY);
    put_u32(w, t);
    put(w, &n, 8);
    put(w, data, n * elem_size(t));
    return w->oom ? LLM_ERR_NOMEM : LLM_OK;
}

llm_status gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    kv_head(w, key, GGUF_TYPE_ARRAY);
    put_u32(w, GGUF_TYPE_STRING);
    put(w, &n, 8);
    for (uint64_t i = 0; i < n; i++) put_str(w, v[i]);
    return w->oom ? LLM_ERR_NOMEM : LLM_OK;
}

llm_status gguf_writer_tensor(gguf_writer *w, const char *name, quant_type t, int n_dims, const uint64_t *ne)
{
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !quant_block_elems(t) || ne[0] % quant_block_elems(t))
        return LLM_ERR_INVALID_ARG;
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = realloc(w->t, sizeof *p * (size_t)cap);
        if (!p)
            return LLM_ERR_NOMEM;
        w->t = p;
        w->cap_t = cap;
    }
    wtensor *x = &w->t[w->n_t];
    memset(x, 0, sizeof *x);
    x->name = strdup(name);
    if (!x->name)
        return LLM_ERR_NOMEM;
    x->type = t;
    x->n_dims = n_dims;
    uint64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= (x->ne[d] = ne[d]);
    x->nbytes = n / quant_block_elems(t) * quant_block_bytes(t);
    w->n_t++;
    return LLM_OK;
}

/* (n == 0 writes nothing: a metadata buffer of a file without tensors may be NULL) */
static int write_all(FILE *f, const void *p, size_t n) { return !n || fwrite(p, 1, n, f) == n ? 0 : -1; }

static int pad_to(FILE *f, uint64_t pos, uint64_t *out)
{
    static const uint8_t zeros[ALIGN];
    uint64_t pad = (ALIGN - pos % ALIGN) % ALIGN;
    *out = pos + pad;
    return write_all(f, zeros, pad);
}

static int write_header(gguf_writer *w, FILE *f, uint64_t *pos)
{
    uint32_t magic = 0x46554747u, version = 3;
    uint64_t nt = (uint64_t)w->n_t, off = 0;
    gguf_writer *info = gguf_writer_new();
    if (!info)
        return -1;
    for (int i = 0; i < w->n_t; i++) { /* tensor infos, encoded like metadata */
        wtensor *t = &w->t[i];
        t->offset = off;
        off += (t->nbytes + ALIGN - 1) / ALIGN * ALIGN;
        put_str(info, t->name);
        put_u32(info, (uint32_t)t->n_dims);
        put(info, t->ne, 8 * (size_t)t->n_dims);
        put_u32(info, t->type);
        put(info, &t->offset, 8);
    }
    int rc = info->oom || write_all(f, &magic, 4) || write_all(f, &version, 4) || write_all(f, &nt, 8) ||
             write_all(f, &w->n_kv, 8) || write_all(f, w->meta, w->meta_n) ||
             write_all(f, info->meta, info->meta_n);
    *pos = 24 + w->meta_n + info->meta_n;
    gguf_writer_free(info);
    return rc ? -1 : pad_to(f, *pos, pos);
}

llm_status gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx, llm_error *err)
{
    if (w->oom)
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for metadata", path);
    FILE *f = fopen(path, "wb");
    if (!f)
        return llm_errf(err, LLM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    uint64_t pos = 0;
    llm_status st = LLM_OK;
    if (write_header(w, f, &pos))
        st = llm_errf(err, LLM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    for (int i = 0; i < w->n_t && !st; i++) {
        void *buf = malloc(w->t[i].nbytes);
        if (!buf)
            st = llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for tensor %s", path, w->t[i].name);
        else if (fill(ctx, i, buf, w->t[i].nbytes))
            st = llm_errf(err, LLM_ERR_INTERNAL, "%s: could not produce tensor %s", path, w->t[i].name);
        else if (write_all(f, buf, w->t[i].nbytes) || pad_to(f, pos + w->t[i].nbytes, &pos))
            st = llm_errf(err, LLM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        free(buf);
    }
    if (fclose(f) && !st)
        st = llm_errf(err, LLM_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    if (st)
        remove(path);
    return st;
}
