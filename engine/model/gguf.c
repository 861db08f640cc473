/* gguf.c - GGUF v2/v3 reader: mmap the file, validate everything once.
 *
 * Parsing goes through a bounded cursor: every read checks the remaining
 * length first, so a truncated or hostile file produces an error message
 * naming the field and offset instead of an out-of-bounds read. */
#include "llm/gguf.h"
#include "llm/split_name.h"
#include "llm/strmap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
/* Limits that no real model approaches; they stop absurd counts from
 * turning into huge allocations before the size checks catch them. */
#define GGUF_MAX_KV 1000000
#define GGUF_MAX_TENSORS 1000000
#define GGUF_MAX_ARRAY_DEPTH 4
/* llama.cpp's gguf-split names parts with five digits. */
#define GGUF_MAX_PARTS 99999

typedef enum gguf_base { GGUF_BORROWED = 0, GGUF_MAPPED, GGUF_COPIED } gguf_base;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    gguf_base held;  /* what base is: the caller's, a mapping (munmap on close) or a heap copy (free) */
    int fd;          /* a mapping's file, kept open to tell a change of it (gguf_unchanged); -1 otherwise */
    struct timespec mtime, ctime; /* the file's, when mapped (ctime: no one can set it back) */
    char name[256];
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    /* A split set: parts[0] is this file, parts[1..] the others (owned);
     * tensors is then the set's merged list. */
    gguf_file **parts;
    uint32_t n_parts;
};

typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
    const char *name;
    llm_error *err;
} cursor;

static llm_status cur_need(cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return llm_errf(c->err, LLM_ERR_FORMAT,
                        "%s: %s at offset %zu needs %llu bytes, file has %zu",
                        c->name, what, c->pos, (unsigned long long)n, c->size);
    return LLM_OK;
}

static llm_status cur_read(cursor *c, void *dst, size_t n, const char *what)
{
    llm_status st = cur_need(c, n, what);
    if (st)
        return st;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return LLM_OK;
}

static llm_status cur_u32(cursor *c, uint32_t *v, const char *what) { return cur_read(c, v, 4, what); }
static llm_status cur_u64(cursor *c, uint64_t *v, const char *what) { return cur_read(c, v, 8, what); }

static llm_status cur_str(cursor *c, gguf_str *s, const char *what)
{
    llm_status st = cur_u64(c, &s->len, what);
    if (st)
        return st;
    st = cur_need(c, s->len, what);
    if (st)
        return st;
    s->data = (const char *)c->base + c->pos;
    c->pos += s->len;
    return LLM_OK;
}

static size_t type_size(gguf_type t)
{
    static const size_t sz[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_TYPE_COUNT ? sz[t] : 0;
}

const char *gguf_type_name(gguf_type t)
{
    static const char *n[GGUF_TYPE_COUNT] = {"u8", "i8", "u16", "i16", "u32", "i32",
                                             "f32", "bool", "string", "array", "u64",
                                             "i64", "f64"};
    return (unsigned)t < GGUF_TYPE_COUNT ? n[t] : "invalid";
}

/* Reads one scalar of type t into kv's union, widened. */
static llm_status read_scalar(cursor *c, gguf_type t, gguf_kv *kv, const char *what)
{
    uint8_t raw[8] = {0};
    llm_status st = cur_read(c, raw, type_size(t), what);
    if (st)
        return st;
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: kv->v.u64 = raw[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)raw[0]; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, raw, 2); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, raw, 2); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, raw, 4); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, raw, 4); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, raw, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&kv->v.u64, raw, 8); break;
    case GGUF_TYPE_INT64: memcpy(&kv->v.i64, raw, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&kv->v.f64, raw, 8); break;
    default: break;
    }
    return LLM_OK;
}

/* Skips (validating) an array body; used for nested arrays. */
static llm_status skip_array(cursor *c, int depth, const char *key)
{
    uint32_t t;
    uint64_t n;
    llm_status st = cur_u32(c, &t, "array type");
    if (!st)
        st = cur_u64(c, &n, "array length");
    if (st)
        return st;
    if (t >= GGUF_TYPE_COUNT || depth > GGUF_MAX_ARRAY_DEPTH)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: key %s: bad nested array (type %u, depth %d)",
                        c->name, key, t, depth);
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (t == GGUF_TYPE_STRING)
            st = cur_str(c, &s, "array string");
        else if (t == GGUF_TYPE_ARRAY)
            st = skip_array(c, depth + 1, key);
        else {
            st = cur_need(c, type_size((gguf_type)t) * (n - i), "array data");
            if (!st)
                c->pos += type_size((gguf_type)t) * (n - i);
            return st;
        }
        if (st)
            return st;
    }
    return LLM_OK;
}

static llm_status read_array(cursor *c, gguf_kv *kv, const char *key)
{
    uint32_t t;
    llm_status st = cur_u32(c, &t, "array type");
    if (!st)
        st = cur_u64(c, &kv->arr_n, "array length");
    if (st)
        return st;
    if (t >= GGUF_TYPE_COUNT)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: key %s: invalid array element type %u", c->name, key, t);
    kv->arr_type = (gguf_type)t;
    kv->arr_data = c->base + c->pos;
    if (t == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < kv->arr_n && !st; i++)
            st = skip_array(c, 1, key);
        return st;
    }
    if (t != GGUF_TYPE_STRING) {
        /* divide instead of multiply: n * size must not overflow */
        if (kv->arr_n > (c->size - c->pos) / type_size(kv->arr_type))
            return llm_errf(c->err, LLM_ERR_FORMAT, "%s: key %s: array of %llu %s beyond end of file (size %zu)",
                            c->name, key, (unsigned long long)kv->arr_n, gguf_type_name(kv->arr_type), c->size);
        c->pos += kv->arr_n * type_size(kv->arr_type);
        return LLM_OK;
    }
    /* each string needs at least its 8-byte length */
    if (kv->arr_n > (c->size - c->pos) / 8)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: key %s: %llu strings cannot fit in file (size %zu)",
                        c->name, key, (unsigned long long)kv->arr_n, c->size);
    kv->strs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof *kv->strs);
    if (!kv->strs)
        return llm_errf(c->err, LLM_ERR_NOMEM, "%s: key %s: no memory for %llu strings", c->name, key,
                        (unsigned long long)kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        st = cur_str(c, &kv->strs[i], "array string");
        if (st)
            return st;
    }
    return LLM_OK;
}

static void key_cstr(gguf_str s, char *buf, size_t n)
{
    size_t len = s.len < n - 1 ? s.len : n - 1;
    memcpy(buf, s.data, len);
    buf[len] = 0;
}

static llm_status read_kv(cursor *c, gguf_kv *kv)
{
    uint32_t t;
    char key[128];
    llm_status st = cur_str(c, &kv->key, "metadata key");
    if (st)
        return st;
    key_cstr(kv->key, key, sizeof key);
    st = cur_u32(c, &t, "metadata value type");
    if (st)
        return st;
    if (t >= GGUF_TYPE_COUNT)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: key %s: invalid value type %u", c->name, key, t);
    kv->type = (gguf_type)t;
    if (t == GGUF_TYPE_STRING)
        return cur_str(c, &kv->v.str, key);
    if (t == GGUF_TYPE_ARRAY)
        return read_array(c, kv, key);
    return read_scalar(c, kv->type, kv, key);
}

static llm_status read_tensor_info(cursor *c, gguf_tensor *ti)
{
    char name[128];
    uint32_t type;
    llm_status st = cur_str(c, &ti->name, "tensor name");
    if (!st)
        st = cur_u32(c, &ti->n_dims, "tensor n_dims");
    if (st)
        return st;
    key_cstr(ti->name, name, sizeof name);
    if (ti->n_dims == 0 || ti->n_dims > GGUF_MAX_DIMS)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: tensor %s: n_dims %u not in 1..%d", c->name, name,
                        ti->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        ti->ne[d] = 1;
        if (d < ti->n_dims && (st = cur_u64(c, &ti->ne[d], "tensor dim")))
            return st;
    }
    if ((st = cur_u32(c, &type, "tensor type")) || (st = cur_u64(c, &ti->offset, "tensor offset")))
        return st;
    if (!quant_type_name(type))
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: tensor %s: invalid type id %u", c->name, name, type);
    if (!quant_supported((quant_type)type))
        return llm_errf(c->err, LLM_ERR_UNSUPPORTED, "%s: tensor %s: type %s is not supported "
                        "(supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                        c->name, name, quant_type_name(type));
    ti->type = (quant_type)type;
    return LLM_OK;
}

/* Computes nbytes with overflow checks and checks the data range. */
static llm_status tensor_bounds(gguf_file *f, gguf_tensor *ti, llm_error *err)
{
    char name[128];
    key_cstr(ti->name, name, sizeof name);
    uint64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (ti->ne[d] == 0 || n > UINT64_MAX / 8 / ti->ne[d] / 1024)
            return llm_errf(err, LLM_ERR_FORMAT, "%s: tensor %s: dimension %d = %llu invalid or too large",
                            f->name, name, d, (unsigned long long)ti->ne[d]);
        n *= ti->ne[d];
    }
    size_t be = quant_block_elems(ti->type);
    if (ti->ne[0] % be)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: tensor %s: row length %llu not a multiple of the %s block (%zu)",
                        f->name, name, (unsigned long long)ti->ne[0], quant_type_name(ti->type), be);
    ti->nbytes = n / be * quant_block_bytes(ti->type);
    if (ti->offset % f->alignment)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: tensor %s: offset %llu not aligned to %llu", f->name, name,
                        (unsigned long long)ti->offset, (unsigned long long)f->alignment);
    uint64_t avail = f->size - f->data_offset;
    if (ti->offset > avail || ti->nbytes > avail - ti->offset)
        return llm_errf(err, LLM_ERR_FORMAT, "tensor %s: data [%llu, %llu) beyond end of file %s (size %zu)", name,
                        (unsigned long long)(f->data_offset + ti->offset),
                        (unsigned long long)(f->data_offset + ti->offset + ti->nbytes), f->name, f->size);
    ti->data = f->base + f->data_offset + ti->offset;
    return LLM_OK;
}

static llm_status read_header(gguf_file *f, cursor *c)
{
    uint32_t magic;
    llm_status st = cur_u32(c, &magic, "magic");
    if (st)
        return st;
    if (magic != GGUF_MAGIC)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: not a GGUF file (magic 0x%08x)", f->name, magic);
    if ((st = cur_u32(c, &f->version, "version")))
        return st;
    if (f->version != 2 && f->version != 3)
        return llm_errf(c->err, LLM_ERR_UNSUPPORTED, "%s: GGUF version %u not supported (2 or 3)", f->name,
                        f->version);
    if ((st = cur_u64(c, &f->n_tensors, "tensor count")) || (st = cur_u64(c, &f->n_kv, "metadata count")))
        return st;
    if (f->n_tensors > GGUF_MAX_TENSORS || f->n_kv > GGUF_MAX_KV)
        return llm_errf(c->err, LLM_ERR_FORMAT, "%s: implausible counts: %llu tensors, %llu metadata keys",
                        f->name, (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv);
    return LLM_OK;
}

static llm_status read_alignment(gguf_file *f, llm_error *err)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    if (!kv)
        return LLM_OK;
    if (kv->type != GGUF_TYPE_UINT32)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: general.alignment has type %s, expected u32", f->name,
                        gguf_type_name(kv->type));
    if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)))
        return llm_errf(err, LLM_ERR_FORMAT, "%s: general.alignment %llu is not a power of two", f->name,
                        (unsigned long long)kv->v.u64);
    f->alignment = kv->v.u64;
    return LLM_OK;
}

static llm_status parse(gguf_file *f, llm_error *err)
{
    cursor c = {f->base, f->size, 0, f->name, err};
    llm_status st = read_header(f, &c);
    if (st)
        return st;
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors)
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for metadata", f->name);
    for (uint64_t i = 0; i < f->n_kv; i++)
        if ((st = read_kv(&c, &f->kv[i])))
            return st;
    if ((st = read_alignment(f, err)))
        return st;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = read_tensor_info(&c, &f->tensors[i])))
            return st;
    f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors && f->data_offset > f->size)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: data section at %llu beyond end of file (size %zu)", f->name,
                        (unsigned long long)f->data_offset, f->size);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if ((st = tensor_bounds(f, &f->tensors[i], err)))
            return st;
    return LLM_OK;
}

static gguf_file *file_new(const char *name)
{
    gguf_file *f = calloc(1, sizeof *f);
    if (f) {
        snprintf(f->name, sizeof f->name, "%s", name ? name : "(buffer)");
        f->fd = -1;
    }
    return f;
}

llm_status gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file **out, llm_error *err)
{
    *out = NULL;
    gguf_file *f = file_new(name);
    if (!f)
        return llm_errf(err, LLM_ERR_NOMEM, "gguf: no memory");
    f->base = buf;
    f->size = size;
    llm_status st = parse(f, err);
    if (st) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return LLM_OK;
}

/* Opens path for reading (*fd) and checks it is a non-empty regular file
 * of *size bytes. */
static llm_status open_regular(const char *path, int *fd, size_t *size, llm_error *err)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return llm_errf(err, LLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    llm_status st = LLM_OK;
    if (fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = llm_errf(err, LLM_ERR_IO, "%s: not a regular file", path);
    else if (sb.st_size == 0)
        st = llm_errf(err, LLM_ERR_FORMAT, "%s: empty file", path);
    if (st) {
        close(*fd);
        *fd = -1;
        return st;
    }
    *size = (size_t)sb.st_size;
    return LLM_OK;
}

/* A check of each mapped file before it is parsed (gguf_open_checked). */
typedef struct part_check {
    gguf_part_check_fn fn;
    void *ctx;
} part_check;

static llm_status open_one(const char *path, const part_check *ck, gguf_file **out, llm_error *err)
{
    *out = NULL;
    size_t size;
    int fd;
    llm_status st = open_regular(path, &fd, &size, err);
    if (st)
        return st;
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return llm_errf(err, LLM_ERR_IO, "%s: cannot stat it: %s", path, strerror(e));
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    if (p == MAP_FAILED) {
        close(fd);
        return llm_errf(err, LLM_ERR_IO, "%s: mmap failed: %s", path, strerror(mmap_errno));
    }
    st = ck && ck->fn ? ck->fn(ck->ctx, path, p, size, err) : LLM_OK; /* the bytes mapped, before the parser sees them */
    if (!st)
        st = gguf_open_buffer(p, size, path, out, err);
    if (st) {
        munmap(p, size);
        close(fd);
        return st;
    }
    (*out)->held = GGUF_MAPPED;
    (*out)->fd = fd; /* (the mapping's pages follow the file: an in-place change shows in its size or mtime) */
    (*out)->mtime = sb.st_mtim;
    (*out)->ctime = sb.st_ctim;
    return LLM_OK;
}

/* Reads exactly size bytes of fd into buf; a file that shrinks or grows
 * while read is an error (the copy would not be the file that was checked). */
static llm_status read_exact(int fd, uint8_t *buf, size_t size, const char *path, llm_error *err)
{
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return llm_errf(err, LLM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (n == 0)
            return llm_errf(err, LLM_ERR_IO, "%s: the file shrank while read (%zu of %zu bytes)", path, got, size);
        got += (size_t)n;
    }
    uint8_t extra;
    ssize_t n;
    while ((n = pread(fd, &extra, 1, (off_t)size)) < 0 && errno == EINTR) {
    }
    if (n < 0)
        return llm_errf(err, LLM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (n > 0)
        return llm_errf(err, LLM_ERR_IO, "%s: the file grew while read (past %zu bytes)", path, size);
    return LLM_OK;
}

llm_status gguf_read(const char *path, size_t max_size, gguf_file **out, llm_error *err)
{
    return gguf_read_checked(path, max_size, NULL, NULL, out, err);
}

llm_status gguf_read_checked(const char *path, size_t max_size, gguf_check_fn check, void *ctx, gguf_file **out,
                             llm_error *err)
{
    *out = NULL;
    size_t size;
    int fd;
    llm_status st = open_regular(path, &fd, &size, err);
    if (st)
        return st;
    if (size > max_size) {
        close(fd);
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s: %zu bytes, more than the %zu allowed", path, size, max_size);
    }
    /* 64-byte aligned like a mapping's start, so tensor data keeps the
     * file's alignment; aligned_alloc wants a multiple of the alignment. */
    uint8_t *buf = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!buf) {
        close(fd);
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for its %zu bytes", path, size);
    }
    st = read_exact(fd, buf, size, path, err);
    close(fd);
    if (!st && check)
        st = check(ctx, buf, size, err);
    if (!st)
        st = gguf_open_buffer(buf, size, path, out, err);
    if (st) {
        free(buf);
        return st;
    }
    (*out)->held = GGUF_COPIED;
    return LLM_OK;
}

/* The split.* keys of a part: its 0-based number, the set's part count
 * and (in every part llama.cpp writes) the set's tensor count. */
typedef struct split_info { uint64_t no, count, tensors; } split_info;

static llm_status split_keys(const gguf_file *f, split_info *si, llm_error *err)
{
    *si = (split_info){0, 1, 0};
    llm_status st = gguf_get_u64(f, "split.count", &si->count, err);
    if (st == LLM_ERR_INVALID_ARG)
        return LLM_OK;
    if (!st && (st = gguf_get_u64(f, "split.no", &si->no, err)) == LLM_ERR_INVALID_ARG)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: split.count without split.no", f->name);
    if (!st && (st = gguf_get_u64(f, "split.tensors.count", &si->tensors, err)) == LLM_ERR_INVALID_ARG)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: split.count without split.tensors.count", f->name);
    if (!st && (si->count < 1 || si->count > GGUF_MAX_PARTS || si->no >= si->count))
        return llm_errf(err, LLM_ERR_FORMAT, "%s: split.no %llu, split.count %llu: not a part of a set", f->name,
                        (unsigned long long)si->no, (unsigned long long)si->count);
    return st;
}

/* Part k (0-based) of the set named like path; a part that cannot be
 * opened makes the set incomplete, said as such. */
static llm_status open_part(const char *path, uint32_t k, uint64_t count, const part_check *ck, gguf_file **out,
                            llm_error *err)
{
    char name[4096];
    if (!llm_split_path(path, k + 1, name, sizeof name))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s: part name too long", path);
    llm_status st = open_one(name, ck, out, err);
    if (st == LLM_ERR_IO) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return llm_errf(err, LLM_ERR_IO, "the split set of %s is incomplete: part %u of %llu: %s", path, k + 1,
                        (unsigned long long)count, why);
    }
    return st;
}

/* Every part against the first's keys: a part of another split (other
 * count, other tensor total, or in the wrong place) is refused by name. */
static llm_status check_parts(gguf_file **parts, uint64_t count, split_info *first, llm_error *err)
{
    llm_status st = split_keys(parts[0], first, err);
    for (uint32_t k = 0; k < count && !st; k++) {
        split_info si;
        if ((st = split_keys(parts[k], &si, err)))
            break;
        if (si.count != first->count || si.no != k || si.tensors != first->tensors)
            st = llm_errf(err, LLM_ERR_FORMAT,
                          "%s: says it is part %llu of %llu of a set of %llu tensors, but the set's first part says "
                          "part %u of %llu of %llu tensors: parts of different splits",
                          parts[k]->name, (unsigned long long)si.no + 1, (unsigned long long)si.count,
                          (unsigned long long)si.tensors, k + 1, (unsigned long long)first->count,
                          (unsigned long long)first->tensors);
    }
    return st;
}

/* One tensor list for the set; each tensor's data stays in its own part's
 * mapping. Every tensor appears once and the total is the one the set
 * declares: a missing or doubled part cannot pass. */
static llm_status merge_tensors(gguf_file *f, uint64_t want, llm_error *err)
{
    uint64_t total = 0;
    for (uint32_t k = 0; k < f->n_parts; k++) total += f->parts[k]->n_tensors;
    if (total != want)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: the %u parts hold %llu tensors, the set declares %llu", f->name,
                        f->n_parts, (unsigned long long)total, (unsigned long long)want);
    gguf_tensor *all = calloc(total ? total : 1, sizeof *all);
    llm_strmap names = {0};
    if (!all || llm_strmap_init(&names, total)) {
        free(all);
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for %llu tensors", f->name, (unsigned long long)total);
    }
    llm_status st = LLM_OK;
    for (uint32_t k = 0, n = 0; k < f->n_parts && !st; k++)
        for (uint64_t i = 0; i < f->parts[k]->n_tensors && !st; i++, n++) {
            all[n] = f->parts[k]->tensors[i];
            if (all[n].name.len > UINT32_MAX)
                st = llm_errf(err, LLM_ERR_FORMAT, "%s: a tensor name of %llu bytes", f->parts[k]->name,
                              (unsigned long long)all[n].name.len);
            else if (llm_strmap_get(&names, all[n].name.data, all[n].name.len) >= 0)
                st = llm_errf(err, LLM_ERR_FORMAT, "%s: tensor %.*s appears twice in the split set",
                              f->parts[k]->name, (int)(all[n].name.len > 128 ? 128 : all[n].name.len),
                              all[n].name.data);
            else
                llm_strmap_put(&names, all[n].name.data, all[n].name.len, (int32_t)k);
        }
    llm_strmap_free(&names);
    if (st) {
        free(all);
        return st;
    }
    free(f->tensors);
    f->tensors = all;
    f->n_tensors = total;
    return LLM_OK;
}

/* f is the part path names; on success *out is the set's first part with
 * every part attached (f included), on failure f is closed. */
static llm_status open_set(gguf_file *f, const char *path, const split_info *si, const part_check *ck, gguf_file **out,
                           llm_error *err)
{
    char named[4096];
    *out = NULL;
    if (llm_split_path(path, 0, NULL, 0) != (int)si->count ||
        !llm_split_path(path, (uint32_t)si->no + 1, named, sizeof named) || strcmp(named, path)) {
        gguf_close(f);
        return llm_errf(err, LLM_ERR_FORMAT,
                        "%s: part %llu of %llu of a split GGUF whose name does not end in -%05llu-of-%05llu.gguf "
                        "(llama.cpp's gguf-split naming), so the other parts cannot be found",
                        path, (unsigned long long)si->no + 1, (unsigned long long)si->count,
                        (unsigned long long)si->no + 1, (unsigned long long)si->count);
    }
    gguf_file **parts = calloc(si->count, sizeof *parts);
    if (!parts) {
        gguf_close(f);
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for %llu parts", path, (unsigned long long)si->count);
    }
    parts[si->no] = f;
    split_info first;
    llm_status st = LLM_OK;
    for (uint32_t k = 0; k < si->count && !st; k++)
        if (!parts[k])
            st = open_part(path, k, si->count, ck, &parts[k], err);
    if (!st)
        st = check_parts(parts, si->count, &first, err);
    if (st) {
        for (uint64_t k = 0; k < si->count; k++) gguf_close(parts[k]);
        free(parts);
        return st;
    }
    parts[0]->parts = parts;
    parts[0]->n_parts = (uint32_t)si->count;
    if ((st = merge_tensors(parts[0], first.tensors, err))) {
        gguf_close(parts[0]);
        return st;
    }
    *out = parts[0];
    return LLM_OK;
}

llm_status gguf_open(const char *path, gguf_file **out, llm_error *err)
{
    return gguf_open_checked(path, NULL, NULL, out, err);
}

llm_status gguf_open_checked(const char *path, gguf_part_check_fn check, void *ctx, gguf_file **out, llm_error *err)
{
    gguf_file *f = NULL;
    split_info si;
    part_check ck = {check, ctx};
    llm_status st = open_one(path, &ck, &f, err);
    if (!st && (st = split_keys(f, &si, err)))
        gguf_close(f);
    if (st) {
        *out = NULL;
        return st;
    }
    if (si.count <= 1) {
        *out = f;
        return LLM_OK;
    }
    return open_set(f, path, &si, &ck, out, err);
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    for (uint32_t k = 1; k < f->n_parts; k++) gguf_close(f->parts[k]);
    free(f->parts);
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    if (f->held == GGUF_MAPPED)
        munmap((void *)f->base, f->size);
    else if (f->held == GGUF_COPIED)
        free((void *)f->base);
    if (f->fd >= 0)
        close(f->fd);
    free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i) { return i < f->n_kv ? &f->kv[i] : NULL; }
uint64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i) { return i < f->n_tensors ? &f->tensors[i] : NULL; }
const char *gguf_name(const gguf_file *f) { return f->name; }
uint32_t gguf_n_parts(const gguf_file *f) { return f->n_parts ? f->n_parts : 1; }

/* Part k (0: f itself). */
static const gguf_file *part(const gguf_file *f, uint32_t k)
{
    return k == 0 ? f : k < f->n_parts ? f->parts[k] : NULL;
}

const void *gguf_part_bytes(const gguf_file *f, uint32_t k, size_t *size)
{
    const gguf_file *p = part(f, k);
    *size = p ? p->size : 0;
    return p ? p->base : NULL;
}

llm_status gguf_unchanged(const gguf_file *f, llm_error *err)
{
    for (uint32_t k = 0; k < gguf_n_parts(f); k++) {
        const gguf_file *p = part(f, k);
        struct stat sb;
        if (!p || p->fd < 0)
            continue;
        if (fstat(p->fd, &sb))
            return llm_errf(err, LLM_ERR_IO, "%s: cannot stat it again: %s", p->name, strerror(errno));
        if ((size_t)sb.st_size != p->size)
            return llm_errf(err, LLM_ERR_IO, "%s: the file changed while loaded: %zu bytes when mapped, %lld now", p->name,
                            p->size, (long long)sb.st_size);
        if (sb.st_mtim.tv_sec != p->mtime.tv_sec || sb.st_mtim.tv_nsec != p->mtime.tv_nsec ||
            sb.st_ctim.tv_sec != p->ctime.tv_sec || sb.st_ctim.tv_nsec != p->ctime.tv_nsec)
            return llm_errf(err, LLM_ERR_IO, "%s: the file was modified while loaded (its mtime or ctime moved): what was "
                            "checked may not be what is served", p->name);
    }
    return LLM_OK;
}
const char *gguf_part_name(const gguf_file *f, uint32_t k)
{
    return k < gguf_n_parts(f) ? (f->n_parts ? f->parts[k]->name : f->name) : NULL;
}

int gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.data, c, n) == 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

static int is_unsigned(gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64 ||
           t == GGUF_TYPE_BOOL;
}

static int is_signed(gguf_type t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static llm_status wrong_type(const gguf_file *f, const char *key, const gguf_kv *kv, const char *want, llm_error *err)
{
    return llm_errf(err, LLM_ERR_FORMAT, "%s: key %s has type %s, expected %s", f->name, key,
                    gguf_type_name(kv->type), want);
}

llm_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *v, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return LLM_ERR_INVALID_ARG;
    if (is_unsigned(kv->type) && kv->type != GGUF_TYPE_BOOL)
        *v = kv->v.u64;
    else if (is_signed(kv->type) && kv->v.i64 >= 0)
        *v = (uint64_t)kv->v.i64;
    else
        return wrong_type(f, key, kv, "a non-negative integer", err);
    return LLM_OK;
}

llm_status gguf_get_f64(const gguf_file *f, const char *key, double *v, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return LLM_ERR_INVALID_ARG;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64)
        *v = kv->v.f64;
    else if (is_unsigned(kv->type))
        *v = (double)kv->v.u64;
    else if (is_signed(kv->type))
        *v = (double)kv->v.i64;
    else
        return wrong_type(f, key, kv, "a number", err);
    return LLM_OK;
}

llm_status gguf_get_bool(const gguf_file *f, const char *key, int *v, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return LLM_ERR_INVALID_ARG;
    if (kv->type != GGUF_TYPE_BOOL)
        return wrong_type(f, key, kv, "bool", err);
    *v = kv->v.u64 != 0;
    return LLM_OK;
}

llm_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *v, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return LLM_ERR_INVALID_ARG;
    if (kv->type != GGUF_TYPE_STRING)
        return wrong_type(f, key, kv, "string", err);
    *v = kv->v.str;
    return LLM_OK;
}
