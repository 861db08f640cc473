/* gguf.h - read-only GGUF v2/v3 reader over mmap.
 *
 * gguf_open maps the file and validates all of it up front: header, every
 * metadata key/value (all value types, nested arrays), every tensor info,
 * alignment, and that every tensor's data lies inside the file. After a
 * successful open, no accessor can read out of bounds.
 *
 * Split sets (llama.cpp's gguf-split: PREFIX-00001-of-00003.gguf ...,
 * keys split.no, split.count, split.tensors.count): gguf_open of any part
 * maps every part, checks that they belong together (same count and
 * tensor total, each in its place, every tensor once) and returns one
 * file: the metadata is the first part's, the tensor list the set's, each
 * tensor's data in its own part's mapping (its offset relative to that
 * part's data section). llm/split_name.h names the parts.
 *
 * Ownership: a gguf_file is owned by the caller and freed with gguf_close
 * (which accepts NULL). All strings and data pointers returned point into the
 * mapping and stay valid until gguf_close; strings are NOT NUL-terminated.
 * Thread-safety: after open, all accessors are read-only and may be called
 * from any number of threads. */
#ifndef LLM_GGUF_H
#define LLM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "llm/quant.h"
#include "llm/status.h"

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

typedef struct gguf_str {
    uint64_t len;
    const char *data; /* into the mapping; not NUL-terminated */
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    union {
        uint64_t u64; /* every unsigned integer type and bool, widened */
        int64_t i64;  /* every signed integer type, widened */
        double f64;   /* FLOAT32 and FLOAT64, widened */
        gguf_str str;
    } v;
    /* For ARRAY: element type and count; data points at the first element
     * in the file (little-endian, packed). String elements are indexed
     * through strs (allocated by the reader); nested arrays are validated but
     * not exposed (no known model uses them). */
    gguf_type arr_type;
    uint64_t arr_n;
    const void *arr_data;
    gguf_str *strs;
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length) */
    quant_type type;
    uint64_t offset; /* relative to the data section */
    uint64_t nbytes;
    const void *data; /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps and validates path. On failure returns the status, sets *out = NULL and
 * fills err with a message naming the file and the offending field. */
llm_status gguf_open(const char *path, gguf_file **out, llm_error *err);

/* Same validation over a caller-owned buffer (used by the fuzzer and tests);
 * buf must outlive the returned file. */
llm_status gguf_open_buffer(const void *buf, size_t size, const char *name,
                            gguf_file **out, llm_error *err);

/* Same validation over a copy of the file read into memory, owned by the
 * returned file (its data lives until gguf_close; one file: split.* keys
 * are not followed). For files read once and dropped, such as adapters
 * loaded while serving: a file truncated or replaced while mapped would
 * fault the reader (SIGBUS); a copy cannot. Errors: LLM_ERR_INVALID_ARG
 * (more than max_size bytes: both sizes named, nothing read), LLM_ERR_IO
 * (cannot open or read it, not a regular file, or its size changed while
 * read), LLM_ERR_FORMAT (empty, or gguf_open's checks), LLM_ERR_NOMEM. */
llm_status gguf_read(const char *path, size_t max_size, gguf_file **out, llm_error *err);

/* A check of a file's bytes before they are parsed (a digest): LLM_OK, or
 * a status with err naming the cause. */
typedef llm_status (*gguf_check_fn)(void *ctx, const void *bytes, size_t n, llm_error *err);
/* gguf_read, with check (NULL: none) run on the very bytes then parsed:
 * a file changed between a check of the file and its read cannot pass. */
llm_status gguf_read_checked(const char *path, size_t max_size, gguf_check_fn check, void *ctx, gguf_file **out,
                             llm_error *err);

/* A check of one file of a model (a split set: each part, by its path)
 * on its mapped bytes, before they are parsed: LLM_OK, or a status with
 * err naming the cause. Reading a page of a file cut short since it was
 * mapped raises SIGBUS: the caller guards against it. */
typedef llm_status (*gguf_part_check_fn)(void *ctx, const char *path, const void *bytes, size_t n, llm_error *err);
/* gguf_open with check (NULL: none) run on every mapped file first. */
llm_status gguf_open_checked(const char *path, gguf_part_check_fn check, void *ctx, gguf_file **out, llm_error *err);

void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i);
/* NULL when the key is absent. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);
uint64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
const char *gguf_name(const gguf_file *f);
/* 1 for a single file; a split set's part count and each part's path
 * (NUL-terminated, owned by f; NULL when k is out of range).
 * gguf_open_buffer reads one buffer: split.* keys are not followed there. */
uint32_t gguf_n_parts(const gguf_file *f);
const char *gguf_part_name(const gguf_file *f, uint32_t k);
/* Part k's whole bytes as held (a mapping: reading a page of a file
 * truncated since raises SIGBUS), *size of them; NULL out of range. */
const void *gguf_part_bytes(const gguf_file *f, uint32_t k, size_t *size);
/* LLM_OK while every mapped part's file has the size and mtime it had when
 * mapped; LLM_ERR_IO naming the part and what moved otherwise (a file
 * rewritten in place changes what the mapping reads). Copies and buffers
 * never change. */
llm_status gguf_unchanged(const gguf_file *f, llm_error *err);

/* Typed getters: return LLM_OK and the value, LLM_ERR_FORMAT with a message
 * naming the key when the key has the wrong type, and LLM_ERR_INVALID_ARG
 * (no message) when absent so callers can apply defaults. */
llm_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *v, llm_error *err);
llm_status gguf_get_f64(const gguf_file *f, const char *key, double *v, llm_error *err);
llm_status gguf_get_bool(const gguf_file *f, const char *key, int *v, llm_error *err);
llm_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *v, llm_error *err);

/* Compares a gguf_str with a C string. */
int gguf_str_eq(gguf_str s, const char *c);

const char *gguf_type_name(gguf_type t);

#endif
