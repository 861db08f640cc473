/* gguf_writer.h - writes GGUF v3 files: metadata of any scalar, string and
 * array type, and tensors whose data is produced by a callback at write time
 * (so multi-gigabyte models never sit in memory whole).
 *
 * Ownership: the writer copies every key, string and array it is given; the
 * caller frees it with gguf_writer_free (NULL ok). Not thread-safe. */
#ifndef LLM_GGUF_WRITER_H
#define LLM_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "llm/gguf.h"

typedef struct gguf_writer gguf_writer;

/* Fills dst (nbytes) with the data of tensor index i; returns 0 or -1. */
typedef int (*gguf_fill_fn)(void *ctx, int i, void *dst, size_t nbytes);

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

/* Each setter returns LLM_OK or LLM_ERR_NOMEM. */
llm_status gguf_writer_u32(gguf_writer *w, const char *key, uint32_t v);
llm_status gguf_writer_i32(gguf_writer *w, const char *key, int32_t v);
llm_status gguf_writer_f32(gguf_writer *w, const char *key, float v);
llm_status gguf_writer_bool(gguf_writer *w, const char *key, int v);
llm_status gguf_writer_str(gguf_writer *w, const char *key, const char *v);
/* Raw array of fixed-size elements (not strings). */
llm_status gguf_writer_arr(gguf_writer *w, const char *key, gguf_type t, const void *data, uint64_t n);
llm_status gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);

/* ne[0] is the row length. */
llm_status gguf_writer_tensor(gguf_writer *w, const char *name, quant_type t, int n_dims, const uint64_t *ne);

llm_status gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx, llm_error *err);

#endif
